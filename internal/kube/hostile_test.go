package kube

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// TestMain lets this test binary be the bound around a credential plugin,
// as the provider's binary is: client-go runs /proc/self/exe.
func TestMain(m *testing.M) {
	if IsPluginBound(os.Args[1:]) {
		os.Exit(RunPluginBound(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// tlsServer serves h over TLS, asking for (not requiring) a client certificate.
func tlsServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// kubeconfigFor is a kubeconfig for srv with user (a flow map).
func kubeconfigFor(srv *httptest.Server, server, user string) string {
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	if server == "" {
		server = srv.URL
	}
	return "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: '" + server + "', certificate-authority-data: " + ca + "}\n  name: c\n" +
		"contexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: " + user + "\n"
}

// clientFor loads a client for kubeconfig from a sandbox node's admin.conf.
func clientFor(t *testing.T, kubeconfig string, timeout time.Duration) *Client {
	t.Helper()
	n := testutil.NewNode(t, "n1")
	n.Write(paths.AdminConf, kubeconfig, 0o600)
	c, err := Load(n.R(), timeout, paths.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const nodeJSON = `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","uid":"u1"},"status":{"nodeInfo":{"kubeletVersion":"v1.37.2"},"conditions":[{"type":"Ready","status":"True"}]}}`

// heapGrowth runs f and reports the most the heap grew while it ran.
func heapGrowth(f func()) uint64 {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	f()
	close(done)
	if p := peak.Load(); p > before.HeapAlloc {
		return p - before.HeapAlloc
	}
	return 0
}

// endless is a body that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// TestHostileAnswersAreBounded: an apiserver that answers with an endless
// body, one that claims 10 GiB, or a gzip bomb costs a bounded error
// and bounded memory, for every kind of call (a get, a list, /version,
// /readyz, a refusal's body).
func TestHostileAnswersAreBounded(t *testing.T) {
	// 384 MiB of spaces, gzipped (under 1 MiB): far past MaxAnswer once inflated.
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
	chunk := bytes.Repeat([]byte{' '}, 1<<20)
	for i := 0; i < 384; i++ {
		zw.Write(chunk)
	}
	zw.Close()
	for _, tc := range []struct {
		name  string
		serve func(w http.ResponseWriter, r *http.Request)
	}{
		{"endless body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.Copy(w, endless{})
		}},
		{"endless refusal", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.Copy(w, endless{})
		}},
		{"10 GiB claimed", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(10<<30))
			w.WriteHeader(http.StatusOK)
			io.CopyN(w, endless{}, 1<<20)
		}},
		{"gzip bomb", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(bomb.Bytes())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tlsServer(t, http.HandlerFunc(tc.serve))
			c := clientFor(t, kubeconfigFor(srv, "", "{token: t}"), 20*time.Second)
			ctx := context.Background()
			calls := map[string]func() error{
				"get node":   func() error { _, err := c.Node(ctx, "n1"); return err },
				"list nodes": func() error { _, err := c.Nodes(ctx); return err },
				"version":    func() error { _, err := c.ServerVersion(ctx); return err },
				"readyz":     func() error { return c.Readyz(ctx) },
			}
			for name, call := range calls {
				var err error
				start := time.Now()
				grew := heapGrowth(func() { err = call() })
				if err == nil {
					t.Fatalf("%s: no error", name)
				}
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("%s: %s", name, d)
				}
				if grew > 256<<20 {
					t.Errorf("%s: the heap grew by %d MiB", name, grew>>20)
				}
				if len(err.Error()) > 4096 {
					t.Errorf("%s: an error of %d bytes", name, len(err.Error()))
				}
				if tc.name != "endless refusal" && !errors.Is(err, ErrAnswerTooLarge) && !strings.Contains(err.Error(), ErrAnswerTooLarge.Error()) {
					t.Errorf("%s: %v, want the answer's size named", name, err)
				}
				t.Logf("%s: %s, heap +%d MiB: %.200s", name, time.Since(start).Round(time.Millisecond), grew>>20, err)
			}
		})
	}
}

// TestRedirectsStayWithTheirOrigin: an apiserver that answers 307 to
// plain http:// on another host never gets the client's token sent
// there; the call fails saying why.
func TestRedirectsStayWithTheirOrigin(t *testing.T) {
	var leaked atomic.Int32
	var gotAuth atomic.Value
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Add(1)
		gotAuth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, nodeJSON)
	}))
	t.Cleanup(elsewhere.Close)
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusFound, http.StatusPermanentRedirect} {
		srv := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, code)
		}))
		c := clientFor(t, kubeconfigFor(srv, "", "{token: s3cret-token}"), 5*time.Second)
		_, err := c.Node(context.Background(), "n1")
		if err == nil || !strings.Contains(err.Error(), "redirected to another scheme or host") {
			t.Errorf("%d: %v", code, err)
		}
	}
	if leaked.Load() != 0 {
		t.Fatalf("%d requests reached the other host (Authorization %q)", leaked.Load(), gotAuth.Load())
	}
}

// writePlugin writes an executable shell credential plugin.
func writePlugin(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func execUser(plugin string) string {
	return "{exec: {apiVersion: client.authentication.k8s.io/v1, command: " + plugin + ", interactiveMode: Never, provideClusterInfo: true}}"
}

// recordAuth answers a Node and records each request's Authorization.
type recordAuth struct {
	mu    sync.Mutex
	auths []string
	// refuse answers 401 to a token.
	refuse string
}

func (ra *recordAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ra.mu.Lock()
	ra.auths = append(ra.auths, r.Header.Get("Authorization"))
	ra.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if ra.refuse != "" && r.Header.Get("Authorization") == "Bearer "+ra.refuse {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401,"message":"Unauthorized"}`)
		return
	}
	io.WriteString(w, nodeJSON)
}

func (ra *recordAuth) take() []string {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	out := ra.auths
	ra.auths = nil
	return out
}

// TestCredentialPluginIsBounded: a plugin that prints without end (as
// `yes` does) is stopped at MaxCredential bytes with a bounded heap; one
// that hangs, leaving a child behind, is stopped within the request's
// bound with its process group; its stderr reaches the caller escaped.
// Neither run is kept: the next request runs the plugin again and
// authenticates with what it prints.
func TestCredentialPluginIsBounded(t *testing.T) {
	ra := &recordAuth{}
	srv := tlsServer(t, ra)
	dir := t.TempDir()
	marker, child := filepath.Join(dir, "ran-once"), filepath.Join(dir, "child.pid")
	good := `echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"second-run"}}'` + "\n"
	for _, tc := range []struct{ name, first string }{
		{"endless output", "yes\n"},
		{"hangs with a child", "sleep 300 & echo $! > " + child + "; printf 'going \\033]0;title\\007 to sleep\\n' >&2; wait\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(marker)
			plugin := writePlugin(t, "if [ ! -e "+marker+" ]; then : > "+marker+"; "+tc.first+"fi\n"+good)
			c := clientFor(t, kubeconfigFor(srv, "", execUser(plugin)), 2*time.Second)
			var err error
			start := time.Now()
			stderr := captureStderr(t, func() {
				if grew := heapGrowth(func() { _, err = c.Node(context.Background(), "n1") }); grew > 128<<20 {
					t.Errorf("the heap grew by %d MiB", grew>>20)
				}
			})
			if err == nil || time.Since(start) > 15*time.Second {
				t.Fatalf("first run after %s: %v", time.Since(start), err)
			}
			if got := ra.take(); len(got) != 0 {
				t.Fatalf("a request went out with %q", got)
			}
			if tc.name == "endless output" && !strings.Contains(stderr, "printed more than") {
				t.Errorf("stderr %q", stderr)
			}
			if tc.name == "hangs with a child" {
				if !strings.Contains(stderr, "ran past its bound of 2s") || strings.ContainsRune(stderr, '\033') || !strings.Contains(stderr, `\x1b]0;title\x07`) {
					t.Errorf("stderr %q: want the bound named and the escape sequence escaped", stderr)
				}
				b, _ := os.ReadFile(child)
				var pid int
				fmt.Sscan(string(b), &pid)
				for deadline := time.Now().Add(5 * time.Second); pid > 0 && syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the plugin's child %d outlived it", pid)
					}
				}
			}
			t.Logf("first run: %s: %v; stderr %q", time.Since(start).Round(time.Millisecond), err, stderr)
			if _, err := c.Node(context.Background(), "n1"); err != nil {
				t.Fatalf("the next request: %v", err)
			}
			if got := ra.take(); len(got) != 1 || got[0] != "Bearer second-run" {
				t.Fatalf("the next request sent %q", got)
			}
		})
	}
}

// captureStderr runs f with the process's file descriptor 2 going to a
// pipe: the plugin bound is a child process that inherits it.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string)
	go func() { b, _ := io.ReadAll(io.LimitReader(r, 1<<20)); out <- string(b) }()
	func() {
		defer func() {
			syscall.Dup2(saved, 2)
			syscall.Close(saved)
		}()
		if err := syscall.Dup2(int(w.Fd()), 2); err != nil {
			t.Fatal(err)
		}
		f()
	}()
	w.Close()
	return <-out
}

// TestCredentialPluginRunsAgainAfter401: client-go's exec authenticator
// runs the plugin again when the apiserver answers 401 to what it gave:
// the request after the refusal carries the new token.
func TestCredentialPluginRunsAgainAfter401(t *testing.T) {
	ra := &recordAuth{refuse: "t1"}
	srv := tlsServer(t, ra)
	counter := filepath.Join(t.TempDir(), "n")
	plugin := writePlugin(t, "n=$(cat "+counter+" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "+counter+"\n"+
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t'$n'"}}'`+"\n")
	c := clientFor(t, kubeconfigFor(srv, "", execUser(plugin)), 5*time.Second)
	_, err := c.Node(context.Background(), "n1")
	if !apierrors.IsUnauthorized(err) {
		t.Fatalf("first request: %v", err)
	}
	if _, err := c.Node(context.Background(), "n1"); err != nil {
		t.Fatalf("after the 401: %v", err)
	}
	if got := ra.take(); len(got) != 2 || got[0] != "Bearer t1" || got[1] != "Bearer t2" {
		t.Fatalf("sent %q", got)
	}
}

// TestOnlyTheFilesOfTheContextUsedAreRead: a kubeconfig naming a thousand
// users, each with a 1 MiB file (and some with a FIFO), costs only the
// files of the user its context uses; what they name together is bounded.
func TestOnlyTheFilesOfTheContextUsedAreRead(t *testing.T) {
	ra := &recordAuth{}
	srv := tlsServer(t, ra)
	n := testutil.NewNode(t, "n1")
	big := strings.Repeat("x", 1<<20)
	var users strings.Builder
	for i := 0; i < 1000; i++ {
		f := fmt.Sprintf("/etc/kubernetes/tok/%d", i)
		if i < 20 {
			n.Write(f, big, 0o600)
		} else if i < 25 {
			testutil.Plant(t, n.Path(f), testutil.FIFO)
		}
		fmt.Fprintf(&users, "- name: u%d\n  user: {tokenFile: %s}\n", i, f)
	}
	n.Write("/etc/kubernetes/tok/used", "the-token\n", 0o600)
	kc := strings.Replace(kubeconfigFor(srv, "", "{tokenFile: /etc/kubernetes/tok/used}"), "users:\n", "users:\n"+users.String(), 1)
	n.Write(paths.AdminConf, kc, 0o600)
	var c *Client
	var err error
	start := time.Now()
	if grew := heapGrowth(func() { c, err = Load(n.R(), 5*time.Second, paths.AdminConf) }); grew > 64<<20 {
		t.Errorf("loading grew the heap by %d MiB", grew>>20)
	}
	if err != nil {
		t.Fatalf("%v after %s", err, time.Since(start))
	}
	if _, err := c.Node(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if got := ra.take(); len(got) != 1 || got[0] != "Bearer the-token" {
		t.Fatalf("sent %q", got)
	}
	// The context's own files: more than maxNamedTotal together is refused.
	for _, f := range []string{"ca", "crt", "key", "tok"} {
		n.Write("/etc/kubernetes/big/"+f, big[:maxNamedFile-1], 0o600)
	}
	n.Write(paths.AdminConf, "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: 'https://127.0.0.1:1', certificate-authority: /etc/kubernetes/big/ca}\n  name: c\n"+
		"contexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: {client-certificate: /etc/kubernetes/big/crt, client-key: /etc/kubernetes/big/key, tokenFile: /etc/kubernetes/big/tok}\n"+
		"- name: v\n  user: {}\n", 0o600)
	if _, err := Load(n.R(), time.Second, paths.AdminConf); err == nil || !strings.Contains(err.Error(), "hold more than") {
		t.Fatalf("four files of 1 MiB: %v", err)
	}
}

// TestKubeconfigListAndContext: a KUBECONFIG list merges as kubectl
// merges it (the first file to name a context, cluster or user wins it,
// the first current-context set is used, a missing file is skipped),
// relative paths are the naming file's directory's, and a context chosen
// by name overrides the current one.
func TestKubeconfigListAndContext(t *testing.T) {
	ra := &recordAuth{}
	srv := tlsServer(t, ra)
	n := testutil.NewNode(t, "n1")
	base := kubeconfigFor(srv, "", "{tokenFile: tok}")
	n.Write("/home/op/.kube/a", base, 0o600)
	n.Write("/home/op/.kube/tok", "from-a\n", 0o600)
	// b names the same context and user differently (a wins them), a
	// second context of its own, and sets another current context.
	n.Write("/home/op/other/b", strings.NewReplacer("current-context: x", "current-context: other", "{tokenFile: tok}", "{token: from-b}",
		"- context: {cluster: c, user: u}\n  name: x\n", "- context: {cluster: c, user: u}\n  name: x\n- context: {cluster: c, user: w}\n  name: other\n",
		"users:\n", "users:\n- name: w\n  user: {token: from-b-w}\n").Replace(base), 0o600)
	for _, tc := range []struct {
		src  Source
		want string
	}{
		{SourceFromEnv("", "/home/op/.kube/a:/missing:/home/op/other/b", ""), "Bearer from-a"},
		{SourceFromEnv("", "/home/op/other/b:/home/op/.kube/a", ""), "Bearer from-b-w"},
		{SourceFromEnv("", "/home/op/.kube/a:/home/op/other/b", "other"), "Bearer from-b-w"},
		{SourceFromEnv("/home/op/.kube/a", "/home/op/other/b", ""), "Bearer from-a"},
	} {
		c, err := LoadSource(n.R(), 5*time.Second, tc.src)
		if err != nil {
			t.Fatalf("%+v: %v", tc.src, err)
		}
		if _, err := c.Node(context.Background(), "n1"); err != nil {
			t.Fatal(err)
		}
		if got := ra.take(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%+v: sent %q, want %q", tc.src, got, tc.want)
		}
	}
	if _, err := LoadSource(n.R(), time.Second, SourceFromEnv("", "/home/op/.kube/a", "nope\x1b[2J")); err == nil || strings.ContainsRune(err.Error(), '\x1b') || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("an unknown context: %v", err)
	}
	if _, err := LoadSource(n.R(), time.Second, SourceFromEnv("", "/missing:/gone", "")); err == nil {
		t.Fatal("no file at all")
	}
}

// TestNamesNeverBecomeOtherPaths: a name that would step out of its
// place in a URL path (a hostname like ../namespaces/...) is refused
// before any request is sent.
func TestNamesNeverBecomeOtherPaths(t *testing.T) {
	ra := &recordAuth{}
	srv := tlsServer(t, ra)
	c := clientFor(t, kubeconfigFor(srv, "", "{token: t}"), 5*time.Second)
	ctx := context.Background()
	for _, name := range []string{"../namespaces/kube-system/configmaps/kubeadm-config", "..", "a/b", "a%2fb", "a..b", "Upper", "a b", strings.Repeat("a", 254)} {
		if _, err := c.Node(ctx, name); err == nil {
			t.Errorf("get node %q: no error", name)
		}
		if err := c.Annotate(ctx, name, map[string]string{"a": "b"}); err == nil {
			t.Errorf("annotate %q: no error", name)
		}
		if _, err := c.Pod(ctx, "kube-system", "kube-apiserver-"+name); err == nil {
			t.Errorf("pod for %q: no error", name)
		}
	}
	for _, addr := range []string{"10.0.0.1:6443/../x", "evil.example/x:6443", "10.0.0.1", "10.0.0.1:0", "[::1]:99999", "a b:6443"} {
		if _, err := c.At(addr); err == nil {
			t.Errorf("At(%q): no error", addr)
		}
	}
	if got := ra.take(); len(got) != 0 {
		t.Fatalf("%d requests sent", len(got))
	}
}

// TestWarningsArePrintedEscaped: an apiserver's Warning header reaches
// stderr with its control characters escaped.
func TestWarningsArePrintedEscaped(t *testing.T) {
	srv := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Warning", "299 - \"deprecated \u202emoc.live\"")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, nodeJSON)
	}))
	c := clientFor(t, kubeconfigFor(srv, "", "{token: t}"), 5*time.Second)
	got := captureStderr(t, func() {
		if _, err := c.Node(context.Background(), "n1"); err != nil {
			t.Error(err)
		}
	})
	if strings.ContainsRune(got, '\u202e') || !strings.Contains(got, `Warning: deprecated \u{202e}moc.live`) {
		t.Fatalf("printed %q", got)
	}
	// The same warning again (a gate polling) is not printed again.
	again := captureStderr(t, func() {
		if _, err := c.Node(context.Background(), "n1"); err != nil {
			t.Error(err)
		}
	})
	if strings.Contains(again, "Warning:") {
		t.Fatalf("printed again: %q", again)
	}
}

// TestLoadNamesTheKubeconfigsTried: the error names the files that were
// read and failed, never one that was not tried (join-config reads only
// admin.conf, and said kubelet.conf was unreadable).
func TestLoadNamesTheKubeconfigsTried(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.Write(paths.KubeletConf, "apiVersion: v1\nkind: Config\n", 0o600)
	_, err := Load(n.R(), time.Second, paths.AdminConf)
	if !errors.Is(err, ErrNoKubeconfig) || strings.Contains(err.Error(), "kubelet.conf") ||
		!strings.Contains(err.Error(), "(tried "+paths.AdminConf+"): read "+paths.AdminConf+": ") {
		t.Fatalf("%v", err)
	}
	_, err = Load(n.R(), time.Second, "/missing/a.conf", "/missing/b.conf")
	if !errors.Is(err, ErrNoKubeconfig) || !strings.Contains(err.Error(), "(tried /missing/a.conf, /missing/b.conf)") {
		t.Fatalf("%v", err)
	}
}
