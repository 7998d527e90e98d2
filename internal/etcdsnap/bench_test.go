package etcdsnap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// BenchmarkSnapshotStep compares what a user runs, the
// `provider-kubernetes etcd-snapshot --target v1.37.2` process (etcdctl
// save + sha256 + etcdutl snapshot status + key count + seal, from its exec
// to its exit), with a bare `etcdctl snapshot save` of the same database
// (also from its exec to its exit, same flags, same filesystem), served by
// the real etcd 3.6.8 binary (what a 1.36 control plane runs before the
// 1.37 apply). Each iteration is one round: the bare etcdctl and each
// provider binary once, in an order that rotates every round. Between runs,
// outside the timing, the snapshot is removed (so every run takes it anew,
// for the same target, with nothing to prune) and the filesystem synced.
//
// The provider is the binary `make build` makes from this tree, or the
// ones named in ETCDSNAP_BENCH_PROVIDERS ("before=/path,after=/path": run
// side by side, each against the same bare runs). Its encryption gate
// reads the kernel's stat and statfs, as on a node; only the sandbox's
// /proc/self/mountinfo and /sys (which --root re-bases) say the sandbox's
// real ext4/xfs device is LUKS2 dm-crypt. Peaks are VmHWM sampled every
// 10 ms from /proc: the provider's own, and apart from it the largest of
// its etcdctl and etcdutl children (etcdutl maps the whole snapshot while
// it walks it). Database size: ETCDSNAP_BENCH_MB (default 1024).
// Targets: median step/bare <= 1.2, provider peak RSS <= 64 MiB.
//
//	go test -run '^$' -bench BenchmarkSnapshotStep -benchtime 8x ./internal/etcdsnap/
//
// (the testing package also runs it once with N=1 first: the database is
// built for each invocation, ~30 s)
func BenchmarkSnapshotStep(b *testing.B) {
	testutil.RequireRoot(b)
	mb := 1024
	if s := os.Getenv("ETCDSNAP_BENCH_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	providers := testbin.Providers(b, "ETCDSNAP_BENCH_PROVIDERS", "bare")
	bin := testbin.Etcd(b, EtcdOnKubeadm136)
	n := testutil.NewNode(b, "cp1")
	etcdtest.BundleEtcdTools(b, n)
	sandboxOnRealDevice(b, n)
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
	backup := n.Path(paths.EtcdBackupDir)
	// The bare save writes next to the backup directory: the same filesystem.
	bareDir := n.Path(paths.PersistDir + "/bare")
	if err := os.MkdirAll(bareDir, 0o700); err != nil {
		b.Fatal(err)
	}
	bareOut := filepath.Join(bareDir, "bare.db")
	bareArgs := []string{"--endpoints=" + e.ClientURL, "--cacert=" + n.Path(etcdtest.CACert),
		"--cert=" + n.Path(etcdtest.HCCert), "--key=" + n.Path(etcdtest.HCKey), "--dial-timeout=10s", "--command-timeout=5m",
		"snapshot", "save", bareOut}
	const target = "v1.37.2"
	clean := func() {
		ents, _ := os.ReadDir(backup)
		for _, ent := range ents {
			os.Remove(filepath.Join(backup, ent.Name()))
		}
		os.Remove(bareOut)
		unix.Sync() // the removal's and the last run's writeback, journal and discards land here, not in the next run
	}

	type job struct {
		name string
		bin  string
		args []string
	}
	jobs := []job{{name: "bare", bin: etcdctl, args: bareArgs}}
	for _, p := range providers {
		jobs = append(jobs, job{name: p.Name, bin: p.Path, args: []string{"etcd-snapshot", "--target", target, "--root", n.Root}})
	}
	runs := map[string][]benchRun{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		byName := map[string]benchRun{}
		for k := range jobs {
			j := jobs[(i+k)%len(jobs)] // rotate who runs first
			b.StopTimer()
			clean()
			b.StartTimer()
			r := runMeasured(b, j.bin, j.args)
			if j.name == "bare" {
				if r.err != nil {
					b.Fatalf("bare etcdctl: %v\n%s", r.err, r.out)
				}
			} else if err := r.parseStep(); err != nil {
				b.Fatalf("%s: %v\n%s", j.name, err, r.out)
			}
			byName[j.name] = r
			runs[j.name] = append(runs[j.name], r)
		}
		bare := byName["bare"]
		line := fmt.Sprintf("round %d: bare etcdctl %s (peak %d MiB)", i+1, bare.took.Round(time.Millisecond), bare.hwm>>20)
		for _, p := range providers {
			r := byName[p.Name]
			line += fmt.Sprintf("; %s %s = %.3f x bare (save %s, verify %s), peak RSS %d MiB (anonymous %d MiB), etcdctl/etcdutl peak %d MiB",
				p.Name, r.took.Round(time.Millisecond), r.took.Seconds()/bare.took.Seconds(), r.save.Round(time.Millisecond),
				r.verify.Round(time.Millisecond), r.hwm>>20, r.anon>>20, r.children>>20)
		}
		// On stderr as it happens: the testing package keeps only 10
		// lines of a benchmark's log, kept for the summary below.
		fmt.Fprintln(os.Stderr, line)
	}
	b.StopTimer()
	clean()

	bares := runs["bare"]
	secs := func(rs []benchRun, f func(benchRun) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	bt := secs(bares, func(r benchRun) float64 { return r.took.Seconds() })
	// No summary for the N=1 probe run: its lines would take the room of
	// the real run's (the testing package keeps 10 lines in all).
	logf := func(format string, args ...any) {
		if b.N > 1 {
			b.Logf(format, args...)
		}
	}
	logf("%d rounds, %d MiB database: min / median / max", b.N, dbSize>>20)
	logf("  bare etcdctl            %s", testutil.MinMedianMax(bt, "%.3fs"))
	for _, p := range providers {
		rs := runs[p.Name]
		st := secs(rs, func(r benchRun) float64 { return r.took.Seconds() })
		ratio := make([]float64, len(rs))
		for i := range rs {
			ratio[i] = st[i] / bt[i] // the same round's bare run
		}
		hwm := secs(rs, func(r benchRun) float64 { return float64(r.hwm) / (1 << 20) })
		// One line per provider: with two or three side by side the
		// summary still fits the 10 lines the testing package keeps.
		logf("  %-8s step %s; step/bare %s; save %s; verify %s; peak RSS %s", p.Name,
			testutil.MinMedianMax(st, "%.3fs"), testutil.MinMedianMax(ratio, "%.3f"),
			testutil.MinMedianMax(secs(rs, func(r benchRun) float64 { return r.save.Seconds() }), "%.3fs"),
			testutil.MinMedianMax(secs(rs, func(r benchRun) float64 { return r.verify.Seconds() }), "%.3fs"),
			testutil.MinMedianMax(hwm, "%.1f MiB"))
		prefix := ""
		if len(providers) > 1 {
			prefix = p.Name + "-"
		}
		b.ReportMetric(testutil.Median(ratio), prefix+"step/bare")
		b.ReportMetric(slices.Max(ratio), prefix+"max-step/bare")
		b.ReportMetric(testutil.Median(st), prefix+"step-s")
		b.ReportMetric(slices.Max(hwm), prefix+"provider-peak-RSS-MiB")
		b.ReportMetric(slices.Max(secs(rs, func(r benchRun) float64 { return float64(r.anon) / (1 << 20) })), prefix+"provider-peak-anon-MiB")
		b.ReportMetric(slices.Max(secs(rs, func(r benchRun) float64 { return float64(r.children) / (1 << 20) })), prefix+"step-tools-peak-RSS-MiB")
	}
	b.ReportMetric(testutil.Median(bt), "bare-s")
	b.ReportMetric(slices.Max(secs(bares, func(r benchRun) float64 { return float64(r.hwm) / (1 << 20) })), "etcdctl-peak-RSS-MiB")
	b.ReportMetric(float64(dbSize)/(1<<20), "db-MiB")
}

// sandboxOnRealDevice lays out a Kairos node whose COS_PERSISTENT
// (/usr/local, bind-mounted onto /etc/kubernetes and /var/lib/etcd) is the
// device the sandbox really is on, described in the sandbox's mountinfo and
// /sys as LUKS2 dm-crypt: the provider process's gate then passes on the
// kernel's own stat and statfs of the sandbox, with no seam.
func sandboxOnRealDevice(b *testing.B, n *testutil.Node) {
	if err := os.MkdirAll(n.Path(paths.PersistDir), 0o755); err != nil {
		b.Fatal(err)
	}
	st, err := cryptgate.RealFS{}.Stat(n.Path("/usr/local"))
	if err != nil {
		b.Fatal(err)
	}
	fstype := map[int64]string{cryptgate.MagicExt4: "ext4", cryptgate.MagicXFS: "xfs"}[st.Magic]
	if fstype == "" || st.Dev.Major == 0 {
		b.Fatalf("the sandbox %s is on %s (magic %#x): the benchmark needs TMPDIR on an ext4 or xfs block device", n.Root, st.Dev, st.Magic)
	}
	dev := st.Dev.String()
	n.Write(cryptgate.Mountinfo, fmt.Sprintf(`21 1 0:30 / / rw,relatime shared:1 - overlay overlay rw
40 21 %[1]s / /usr/local rw,relatime shared:20 - %[2]s /dev/mapper/luks-persistent rw
41 21 %[1]s /.state/etc-kubernetes.bind /etc/kubernetes rw,relatime shared:20 - %[2]s /dev/mapper/luks-persistent rw
42 21 %[1]s /.state/var-lib-etcd.bind /var/lib/etcd rw,relatime shared:20 - %[2]s /dev/mapper/luks-persistent rw
`, dev, fstype), 0o444)
	n.Write("/sys/devices/virtual/block/dm-0/dm/uuid", "CRYPT-LUKS2-6b1f0e7a2c3d4e5f8091a2b3c4d5e6f7-luks-persistent\n", 0o444)
	if err := os.MkdirAll(n.Path(cryptgate.SysDevBlk), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink("../../devices/virtual/block/dm-0", n.Path(cryptgate.SysDevBlk+"/"+dev)); err != nil {
		b.Fatal(err)
	}
}

// benchRun is one measured process.
type benchRun struct {
	took                time.Duration // exec to exit
	hwm, anon, children int64         // its VmHWM, largest RssAnon, its children's largest VmHWM
	out                 string
	err                 error
	save, verify        time.Duration // from the provider's taken line
}

var takenLine = regexp.MustCompile(`etcd-snapshot outcome=taken .*\bsave=(\S+) verify=(\S+)`)

// parseStep checks the provider said taken and reads its save and verify times.
func (r *benchRun) parseStep() error {
	if r.err != nil {
		return r.err
	}
	m := takenLine.FindStringSubmatch(r.out)
	if m == nil {
		return fmt.Errorf("no outcome=taken line")
	}
	var err error
	if r.save, err = time.ParseDuration(m[1]); err != nil {
		return err
	}
	r.verify, err = time.ParseDuration(m[2])
	return err
}

// runMeasured runs one command with the environment a unit gives it,
// timing it from before its exec to its exit and sampling its peaks.
func runMeasured(b *testing.B, bin string, args []string) benchRun {
	cmd := testutil.Command(b, 10*time.Minute, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"}
	cmd.Dir = "/"
	var o bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &o
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stop := samplePeaks(cmd.Process.Pid)
	err := cmd.Wait()
	took := time.Since(t0)
	p := stop()
	return benchRun{took: took, hwm: p[0], anon: p[1], children: p[2], out: o.String(), err: err}
}

// samplePeaks samples a process's /proc status every 10 ms: its VmHWM
// (its own high-water mark, monotonic: the last sample is its peak up to
// then), its RssAnon, and the VmHWM of each of its children. The process
// is read through a /proc/PID directory opened while it is certainly
// unreaped, so a recycled PID is never read. stop returns the peaks.
func samplePeaks(pid int) (stop func() [3]int64) {
	dir, err := unix.Open(fmt.Sprintf("/proc/%d", pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return func() [3]int64 { return [3]int64{} }
	}
	var peaks [3]atomic.Int64
	setMax := func(a *atomic.Int64, v int64) {
		if v > a.Load() {
			a.Store(v)
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		defer unix.Close(dir)
		for {
			s := readAt(dir, "status")
			setMax(&peaks[0], statusField(s, "VmHWM:"))
			setMax(&peaks[1], statusField(s, "RssAnon:"))
			for _, c := range children(dir) {
				cs, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", c))
				setMax(&peaks[2], statusField(string(cs), "VmHWM:"))
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() [3]int64 {
		close(done)
		<-finished
		return [3]int64{peaks[0].Load(), peaks[1].Load(), peaks[2].Load()}
	}
}

func readAt(dir int, name string) string {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	buf := make([]byte, 8192)
	var out []byte
	for {
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			return string(out)
		}
		out = append(out, buf[:n]...)
	}
}

// children lists the child PIDs of every thread of the process.
func children(dir int) []int {
	tasks := readDirNames(dir, "task")
	var out []int
	for _, t := range tasks {
		for _, f := range strings.Fields(readAt(dir, "task/"+t+"/children")) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func readDirNames(dir int, name string) []string {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return names
}

// statusField reads one "kB" field of a /proc status in bytes (0 when absent).
func statusField(s, field string) int64 {
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
