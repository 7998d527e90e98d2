package etcdsnap

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// BenchmarkSnapshotStep compares the provider's snapshot step (etcdctl save
// + sha256 + etcdutl snapshot status + key count + seal) with a bare
// `etcdctl snapshot save` of the same database, served by the real etcd
// 3.6.8 binary (what a 1.36 control plane runs before the 1.37 apply). The
// step runs in a child process (this test binary, TestBenchStepChild) so
// its peak RSS is the provider's alone (etcdctl and etcdutl, its children,
// are reported apart). Database size: ETCDSNAP_BENCH_MB
// (default 1024). Targets: step/bare <= 1.3, provider peak RSS <= 64 MiB.
//
//	go test -run '^$' -bench BenchmarkSnapshotStep -benchtime 3x ./internal/etcdsnap/
//
// (the testing package also runs it once with N=1 first: the database is
// built for each invocation, ~15 s)
func BenchmarkSnapshotStep(b *testing.B) {
	testutil.RequireRoot(b)
	mb := 1024
	if s := os.Getenv("ETCDSNAP_BENCH_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	bin := testbin.Etcd(b, EtcdOnKubeadm136)
	n := testutil.NewNode(b, "cp1")
	etcdtest.BundleEtcdTools(b, n)
	etcdtest.EncryptedPersistent(b, n)
	e := etcdtest.StartBinary(b, n, bin, "registry.k8s.io/etcd:3.6.8-0", "--quota-backend-bytes=8589934592")
	start := time.Now()
	const valSize = 4096 // Kubernetes objects are a few KiB
	const chunk = 8192   // keys per round, 32 MiB of values
	keys := 0
	var dbSize int64
	for dbSize < int64(mb)<<20 {
		e.PutKeys(fmt.Sprintf("/registry/bench/%06d/", keys/chunk), chunk, valSize)
		keys += chunk
		c := e.Client()
		st, err := c.Status(context.Background(), e.ClientURL)
		c.Close()
		if err != nil {
			b.Fatal(err)
		}
		dbSize = st.DbSize
	}
	b.Logf("database: %d MiB (%d keys of %d B) built in %s", dbSize>>20, keys, valSize, time.Since(start).Round(time.Second))

	etcdctl := testbin.Etcdctl(b, etcdtest.EtcdctlVersion)
	var bareSum, stepSum time.Duration
	var peakRSS, peakAnon, peakTools, bareRSS int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var step stepRun
		if i%2 == 1 { // alternate which runs first
			step = runStepChild(b, n, version.Version{Major: 1, Minor: 37 + i, Patch: 0})
		}
		// The bare command an operator would run, same flags, same disk.
		out := filepath.Join(b.TempDir(), "bare.db")
		cmd := testutil.Command(b, 10*time.Minute, etcdctl, "--endpoints="+e.ClientURL, "--cacert="+n.Path(etcdtest.CACert),
			"--cert="+n.Path(etcdtest.HCCert), "--key="+n.Path(etcdtest.HCKey), "--dial-timeout=10s", "--command-timeout=5m",
			"snapshot", "save", out)
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop := pollPeak(cmd.Process.Pid, "VmHWM:")
		err := cmd.Wait()
		bare := time.Since(t0)
		if err != nil {
			b.Fatalf("bare etcdctl: %v\n%s", err, o.String())
		}
		bareRSS = max(bareRSS, stop())
		os.Remove(out)

		if i%2 == 0 {
			step = runStepChild(b, n, version.Version{Major: 1, Minor: 37 + i, Patch: 0})
		}
		bareSum += bare
		stepSum += step.took
		peakRSS, peakAnon, peakTools = max(peakRSS, step.rss), max(peakAnon, step.anon), max(peakTools, step.toolsRSS)
		b.Logf("run %d: bare etcdctl %s, provider step %s (ratio %.2f), provider peak RSS %d MiB (anonymous %d MiB), etcdctl/etcdutl peak RSS %d MiB",
			i+1, bare.Round(time.Millisecond), step.took.Round(time.Millisecond), step.took.Seconds()/bare.Seconds(),
			step.rss>>20, step.anon>>20, step.toolsRSS>>20)
	}
	b.StopTimer()
	b.ReportMetric(stepSum.Seconds()/bareSum.Seconds(), "step/bare")
	b.ReportMetric(float64(peakRSS)/(1<<20), "provider-peak-RSS-MiB")
	b.ReportMetric(float64(peakAnon)/(1<<20), "provider-peak-anon-MiB")
	b.ReportMetric(float64(peakTools)/(1<<20), "step-tools-peak-RSS-MiB")
	b.ReportMetric(float64(bareRSS)/(1<<20), "etcdctl-peak-RSS-MiB")
	b.ReportMetric(float64(dbSize)/(1<<20), "db-MiB")
}

// runStepChild runs one Take in a child process and returns its duration
// and peak RSS (as the child measured them) and its sampled peak anonymous RSS.
func runStepChild(b *testing.B, n *testutil.Node, target version.Version) stepRun {
	cmd := testutil.Command(b, 10*time.Minute, os.Args[0], "-test.run=^TestBenchStepChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ETCDSNAP_BENCH_CHILD="+n.Root, "ETCDSNAP_BENCH_TARGET="+target.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stopAnon := pollPeak(cmd.Process.Pid, "RssAnon:")
	var took time.Duration
	var rss, toolsRSS int64
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := sc.Text()
		lines = append(lines, l)
		if rest, ok := strings.CutPrefix(l, "BENCH-RESULT "); ok {
			f := strings.Fields(rest)
			if len(f) < 2 || f[0] != string(Taken) {
				b.Errorf("step: %s", rest)
			}
			if len(f) >= 4 {
				took, _ = time.ParseDuration(f[1])
				rss, _ = strconv.ParseInt(strings.TrimPrefix(f[2], "rss="), 10, 64)
				toolsRSS, _ = strconv.ParseInt(strings.TrimPrefix(f[3], "tools-rss="), 10, 64)
				b.Logf("step: %s", rest)
			}
		}
	}
	peakAnon := stopAnon() // before Wait reaps the child and its /proc entry goes
	err = cmd.Wait()
	if err != nil || took == 0 || rss == 0 {
		b.Fatalf("step child: %v\n%s", err, strings.Join(lines, "\n"))
	}
	return stepRun{took: took, rss: rss, anon: peakAnon, toolsRSS: toolsRSS}
}

// stepRun is one provider step as its child measured it.
type stepRun struct {
	took                time.Duration
	rss, anon, toolsRSS int64 // the provider's peak RSS and sampled anonymous peak; the largest etcdctl/etcdutl
}

// pollPeak samples one field of a process's /proc status every 20 ms
// (VmHWM: its own peak; RssAnon: its anonymous memory); stop returns the
// largest sample taken while it ran.
func pollPeak(pid int, field string) (stop func() int64) {
	var last atomic.Int64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if v := procStatus(pid, field); v > last.Load() {
				last.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		return last.Load()
	}
}

// procStatus reads one "kB" field of /proc/PID/status in bytes (0 when gone).
func procStatus(pid int, field string) int64 {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestBenchStepChild is the benchmark's child: one Take on the parent's node.
func TestBenchStepChild(t *testing.T) {
	root := os.Getenv("ETCDSNAP_BENCH_CHILD")
	if root == "" {
		t.Skip("the child half of BenchmarkSnapshotStep")
	}
	target := version.MustParse(os.Getenv("ETCDSNAP_BENCH_TARGET"))
	r := paths.Root(root)
	o := Options{Root: r, Runner: runner.Exec{Root: root}, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FS: etcdtest.PersistFS{Prefix: r.Path("/usr/local"), Dev: cryptgate.Dev{Major: 254, Minor: 0}}}
	start := time.Now()
	res := Take(context.Background(), o, target)
	took := time.Since(start)
	// VmHWM is this process's own peak. ru_maxrss is not: Linux carries the
	// high-water mark of the image a process replaced at exec, and Go's
	// vfork-style exec shares the parent's memory until then, so every child
	// starts with its parent's peak. RUSAGE_CHILDREN is the largest of the
	// etcdctl and etcdutl this process ran (an upper bound, for the same reason).
	var children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("BENCH-RESULT %s %s rss=%d tools-rss=%d save=%s verify=%s\n", res.Outcome, took, procStatus(os.Getpid(), "VmHWM:"),
		children.Maxrss<<10, res.SaveTook, res.VerifyTook)
	if res.Outcome != Taken {
		t.Fatalf("%+v", res)
	}
}
