package restore

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// KubeadmManifest is etcd.yaml as kubeadm 1.36/1.37 writes it for a
// stacked member on host (getEtcdCommand): a joined member's
// --initial-cluster lists the members known at its join, with
// --initial-cluster-state=existing. Exported for the external tests.
func KubeadmManifest(name, image, host string, client, peer, metrics int, initialCluster string, joined bool) string {
	state := ""
	if joined {
		state = "\n    - --initial-cluster-state=existing"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  labels:
    component: etcd
    tier: control-plane
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls=https://%[3]s:%[4]d
    - --cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --client-cert-auth=true
    - --data-dir=/var/lib/etcd
    - --feature-gates=InitialCorruptCheck=true
    - --initial-advertise-peer-urls=https://%[3]s:%[5]d
    - --initial-cluster=%[7]s%[8]s
    - --key-file=/etc/kubernetes/pki/etcd/server.key
    - --listen-client-urls=https://127.0.0.1:%[4]d,https://%[3]s:%[4]d
    - --listen-metrics-urls=http://127.0.0.1:%[6]d
    - --listen-peer-urls=https://%[3]s:%[5]d
    - --name=%[1]s
    - --peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt
    - --peer-client-cert-auth=true
    - --peer-key-file=/etc/kubernetes/pki/etcd/peer.key
    - --peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --snapshot-count=10000
    - --trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    image: %[2]s
    name: etcd
  hostNetwork: true
`, name, image, host, client, peer, metrics, initialCluster, state)
}

func TestParseMember(t *testing.T) {
	m, err := ParseMember([]byte(KubeadmManifest("cp2", "registry.k8s.io/etcd:3.6.8-0", "10.0.0.12", 2379, 2380, 2381,
		"cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380", true)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "cp2" || m.PeerURLs.String() != "https://10.0.0.12:2380" || m.DataDir != "/var/lib/etcd" ||
		m.OldToken != DefaultToken || m.Etcd != (version.Minor{Major: 3, Minor: 6}) || m.CA != "/etc/kubernetes/pki/etcd/ca.crt" ||
		m.InitialCluster != "cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380" {
		t.Fatalf("%+v", m)
	}
	var got []string
	for _, l := range m.Listen {
		got = append(got, l.Scheme+"://"+l.Addr+" "+l.Flag)
	}
	want := []string{"https://127.0.0.1:2379 --listen-client-urls", "https://10.0.0.12:2379 --listen-client-urls",
		"https://10.0.0.12:2380 --listen-peer-urls", "http://127.0.0.1:2381 --listen-metrics-urls"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("listen %q, want %q", got, want)
	}
	if ep := clientEndpoint(m); ep != "https://127.0.0.1:2379" {
		t.Fatalf("client endpoint %q", ep)
	}

	base := KubeadmManifest("cp1", "registry.k8s.io/etcd:3.6.8-0", "10.0.0.11", 2379, 2380, 2381, "cp1=https://10.0.0.11:2380", false)
	for _, c := range []struct{ name, from, to, want string }{
		{"a separate WAL dir", "    - --snapshot-count=10000\n", "    - --snapshot-count=10000\n    - --wal-dir=/var/lib/etcd-wal\n", "--wal-dir"},
		{"no name", "    - --name=cp1\n", "", "--name"},
		{"a relative data dir", "--data-dir=/var/lib/etcd", "--data-dir=var/lib/etcd", "--data-dir"},
		{"an unclean data dir", "--data-dir=/var/lib/etcd", "--data-dir=/var/lib/../lib/etcd", "--data-dir"},
		{"no peer URL", "    - --initial-advertise-peer-urls=https://10.0.0.11:2380\n", "", "--initial-advertise-peer-urls"},
		{"an image without a version", "etcd:3.6.8-0", "etcd:latest", "not an etcd version"},
		{"a listen URL without a port", "--listen-peer-urls=https://10.0.0.11:2380", "--listen-peer-urls=https://10.0.0.11", "--listen-peer-urls"},
	} {
		b := strings.Replace(base, c.from, c.to, 1)
		if b == base {
			t.Fatalf("%s: the case changes nothing", c.name)
		}
		if _, err := ParseMember([]byte(b)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one naming %q", c.name, err, c.want)
		}
	}
	// An unspecified listen address is probed on loopback.
	m, err = ParseMember([]byte(strings.Replace(base, "--listen-peer-urls=https://10.0.0.11:2380", "--listen-peer-urls=https://0.0.0.0:2380,https://[::]:2380", 1)))
	if err != nil || m.Listen[2].Addr != "127.0.0.1:2380" || m.Listen[3].Addr != "[::1]:2380" {
		t.Fatalf("%v %+v", err, m.Listen)
	}
}

const (
	ic3 = "cp3=https://10.0.0.13:2380,cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380"
	// as etcd writes it: sorted
	ic3Sorted = "cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380,cp3=https://10.0.0.13:2380"
)

// goodFacts: cp2 of three, stopped, the 1.36 manifests to put back, a
// 3.6 snapshot and the 3.6.8 etcdutl.
func goodFacts(t *testing.T) (Facts, Request) {
	t.Helper()
	m, err := ParseMember([]byte(KubeadmManifest("cp2", "registry.k8s.io/etcd:3.6.8-0", "10.0.0.12", 2379, 2380, 2381,
		"cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380", true)))
	if err != nil {
		t.Fatal(err)
	}
	return Facts{Member: m, PutBack: []string{"etcd.yaml", "kube-apiserver.yaml"}, Version: version.MustParse("v1.36.3"),
			HasMember: true, Etcdutl: "3.6.8", Snapshot: Snapshot{Revision: 42, Keys: 7, Size: 20480, Version: "3.6.0"}},
		Request{Snapshot: "/run/etcd-backup/etcd.db", Manifests: "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-12-01-10-00-00",
			InitialCluster: ic3, Token: "etcd-restore-0123456789abcdef", TokenGenerated: true, Now: time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)}
}

func TestDecideAPlan(t *testing.T) {
	f, r := goodFacts(t)
	p, err := Decide(f, r)
	if err != nil {
		t.Fatal(err)
	}
	if p.InitialCluster != ic3Sorted || strings.Join(p.Members, ",") != "cp1,cp2,cp3" || len(p.Notes) != 0 ||
		p.Staging != "/var/lib/etcd/member.restoring-20261201T103000Z" || p.Aside != "/var/lib/etcd/member.pre-restore-20261201T103000Z" {
		t.Fatalf("%+v", p)
	}
	want := "snapshot restore /proc/self/fd/0 --name cp2 --initial-cluster " + ic3Sorted +
		" --initial-cluster-token etcd-restore-0123456789abcdef --initial-advertise-peer-urls https://10.0.0.12:2380" +
		" --data-dir /sandbox/var/lib/etcd/member.restoring-20261201T103000Z --bump-revision 1000000000 --mark-compacted"
	if got := strings.Join(p.RestoreArgs("/sandbox"), " "); got != want {
		t.Fatalf("etcdutl %s\nwant    %s", got, want)
	}

	// No member directory (moved aside by hand): nothing to move.
	f.HasMember = false
	if p, err := Decide(f, r); err != nil || p.Aside != "" {
		t.Fatalf("%v %+v", err, p)
	}
	// A member the manifest names that the restored cluster leaves out is noted.
	f, r = goodFacts(t)
	r.InitialCluster = "cp2=https://10.0.0.12:2380,cp3=https://10.0.0.13:2380"
	if p, err := Decide(f, r); err != nil || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "also names cp1") {
		t.Fatalf("%v %+v", err, p)
	}
	// An older minor's snapshot runs on the next etcd (etcd upgrades it).
	f, r = goodFacts(t)
	f.Snapshot.Version = "3.5.0"
	if _, err := Decide(f, r); err != nil {
		t.Fatal(err)
	}
	// A snapshot that records no storage version (a young etcd 3.6 member
	// had not written it yet) is what etcd reads as 3.5: it runs on etcd
	// 3.6, and the operator is told why no version shows.
	f, r = goodFacts(t)
	f.Snapshot.Version = ""
	if p, err := Decide(f, r); err != nil || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "records no etcd storage version") || !strings.Contains(p.Notes[0], "reads it as 3.5.0") {
		t.Fatalf("%v %+v", err, p)
	}
}

func TestDecideRefusals(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*Facts, *Request)
		want   error
		says   string
	}{
		{"manifests still in place", func(f *Facts, r *Request) { f.InPlace = []string{"/etc/kubernetes/manifests/etcd.yaml"} },
			ErrNotStopped, "still in /etc/kubernetes/manifests: move the static pod manifests out of it (docs/rollback-and-restore, step 1), then wait"},
		{"a port answers", func(f *Facts, r *Request) { f.Listening = []string{"127.0.0.1:2379 (--listen-client-urls)"} },
			ErrNotStopped, "something still listens on 127.0.0.1:2379"},
		{"a port cannot be told free", func(f *Facts, r *Request) { f.Unknown = []string{"10.0.0.12:2380 (--listen-peer-urls): i/o timeout"} },
			ErrNotStopped, "cannot tell whether 10.0.0.12:2380"},
		{"the database is held", func(f *Facts, r *Request) { f.InUse = true }, ErrNotStopped, "held open by a running etcd"},
		{"a manifest that cannot be used", func(f *Facts, r *Request) { f.MemberErr = errors.New("no container \"etcd\"") },
			ErrManifest, "kubeadm-backup-manifests-2026-12-01-10-00-00/etcd.yaml: no container"},
		{"a symlinked data dir", func(f *Facts, r *Request) { f.DataDirErr = errors.New("/var/lib/etcd: symlink not followed") },
			ErrUnsafePath, "data dir /var/lib/etcd: /var/lib/etcd: symlink not followed"},
		{"etcdutl of another minor", func(f *Facts, r *Request) { f.Etcdutl = "3.7.0" },
			ErrVersion, "is 3.7.0 but the manifest to put back runs etcd 3.6 (registry.k8s.io/etcd:3.6.8-0): restore with the etcdutl of the etcd that will run the data: boot the image that bundles etcd 3.6"},
		{"etcdutl that does not answer", func(f *Facts, r *Request) { f.Etcdutl, f.EtcdutlErr = "", errors.New("no such file") },
			ErrVersion, "cannot tell the version of the bundled /usr/bin/etcdutl"},
		{"a snapshot that does not verify", func(f *Facts, r *Request) { f.SnapshotErr = errors.New("mode 0644") },
			ErrSnapshot, "/run/etcd-backup/etcd.db: mode 0644"},
		{"a snapshot of a newer etcd", func(f *Facts, r *Request) { f.Snapshot.Version = "3.7.0" },
			ErrVersion, "written by etcd 3.7, newer than the etcd 3.6 that will run it"},
		{"a snapshot two minors older", func(f *Facts, r *Request) { f.Snapshot.Version = "3.4.0" },
			ErrVersion, "more than one minor older"},
		{"a snapshot without a version, for etcd 3.7 (etcd reads it as 3.5)", func(f *Facts, r *Request) {
			f.Snapshot.Version = ""
			f.Etcdutl = "3.7.0"
			f.Member.Etcd = version.Minor{Major: 3, Minor: 7}
			f.Member.Image = "registry.k8s.io/etcd:3.7.0-0"
		}, ErrVersion, "records no etcd storage version (etcd 3.5 wrote none, and a newer etcd records it a few seconds after it starts): etcd reads it as 3.5.0: more than one minor older than the etcd 3.7 that will run it"},
		{"no --initial-cluster", func(f *Facts, r *Request) { r.InitialCluster = "" },
			ErrInitialCluster, `this member's manifest lists "cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380"`},
		{"--initial-cluster without this member", func(f *Facts, r *Request) {
			r.InitialCluster = "cp1=https://10.0.0.11:2380,cp3=https://10.0.0.13:2380"
		}, ErrInitialCluster, "does not name this member, cp2"},
		{"--initial-cluster with another URL for this member", func(f *Facts, r *Request) {
			r.InitialCluster = strings.Replace(ic3, "10.0.0.12", "10.0.0.99", 1)
		}, ErrInitialCluster, "gives cp2 the peer URL https://10.0.0.99:2380 but its manifest advertises https://10.0.0.12:2380"},
		{"--initial-cluster with one URL twice", func(f *Facts, r *Request) {
			r.InitialCluster = ic3 + ",cp4=https://10.0.0.13:2380"
		}, ErrInitialCluster, "is the peer URL of both"},
		{"--initial-cluster that does not parse", func(f *Facts, r *Request) { r.InitialCluster = "cp2=10.0.0.12:2380" },
			ErrInitialCluster, "--initial-cluster:"},
		{"the old cluster's token", func(f *Facts, r *Request) { r.Token = "etcd-cluster" }, ErrClusterToken, "the token the old cluster ran with"},
		{"a token with a space", func(f *Facts, r *Request) { r.Token = "a b" }, ErrClusterToken, "is not a token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, r := goodFacts(t)
			c.change(&f, &r)
			p, err := Decide(f, r)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err %q\ndoes not say %q", err, c.says)
			}
			if p.Staging != "" || p.Aside != "" {
				t.Fatalf("a refusal with a plan: %+v", p)
			}
		})
	}
}

// Every refusal at once: the operator fixes everything in one go.
func TestDecideJoinsEveryRefusal(t *testing.T) {
	f, r := goodFacts(t)
	f.InPlace = []string{"/etc/kubernetes/manifests/etcd.yaml", "/etc/kubernetes/manifests/kube-apiserver.yaml"}
	f.Etcdutl = "3.7.0"
	r.InitialCluster = ""
	_, err := Decide(f, r)
	for _, s := range []error{ErrNotStopped, ErrVersion, ErrInitialCluster} {
		if !errors.Is(err, s) {
			t.Errorf("%v missing from %v", s, err)
		}
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 3 {
		t.Fatalf("%d lines, want one per refusal:\n%v", n, err)
	}
}

func TestParseStatus(t *testing.T) {
	s, err := parseStatus([]byte(`{"hash":31798301,"revision":2,"totalKey":1,"totalSize":20480,"version":"3.6.0"}`+"\n"), 20512)
	if err != nil || s != (Snapshot{Hash: 31798301, Revision: 2, Keys: 1, Size: 20480, Version: "3.6.0"}) {
		t.Fatalf("%+v %v", s, err)
	}
	for _, b := range []string{``, `{"hash":1}`, `{"hash":1,"revision":2,"totalKey":1,"totalSize":40960,"version":"3.6.0"}`,
		`{"hash":1,"revision":-1,"totalKey":1,"totalSize":20480}`} {
		if _, err := parseStatus([]byte(b), 20512); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
}
