// Command powercut is the guest side of TestPowerCut: in a QEMU guest it
// runs the provider's real atomic writers over and over on a filesystem
// whose disk is cut (dm-flakey drop_writes), then reads what survived.
//
//	powercut init ROOT                     version 0 of every file, then sync(2)
//	powercut hold ROOT KINDS KIND:N        versions 1, 2, ... of KINDS (comma-separated:
//	                                       status, verified, snapshot, in that order) until
//	                                       that call returned, then HOLD until killed
//	powercut cut ROOT KINDS DELAY DEV TABLE  the cut timed by the kernel (see cut)
//	powercut check ROOT                    one STATE line per file
//	powercut noise ROOT                    fsyncs of its own until killed (cut starts it)
//
// hold and cut print "START KIND N" before a call and "RETURNED KIND N"
// after it returned (its promise made; cut adds the time), "ERROR ..." when
// something failed. check prints "STATE FILE N" for a file that is exactly
// version N, "STATE FILE bad WHY" for one that is not (empty, torn,
// unreadable) and "PART NAME SIZE" for a leftover .part. The writers are
// the ones a node runs: status.Write (the run file and the persistent
// mirror), reconcile.WriteVerified (the verified-version record) and
// etcdsnap.Commit (a snapshot's seal, fsync, rename and directory fsync).
// Only etcdctl's part, the snapshot's bytes written to the .part, is stood
// in for here, without an fsync of its own: the provider's fsync is the one
// tested.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/etcdsnap"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// The kinds of write, in the order write makes them.
const (
	kindStatus   = "status"
	kindVerified = "verified"
	kindSnapshot = "snapshot"
)

var kinds = []string{kindStatus, kindVerified, kindSnapshot}

// The files check reports (a snapshot is reported by its name).
var checked = []struct{ name, path string }{
	{"status-run", paths.StatusFile},
	{"status-mirror", paths.StatusMirror},
	{"verified", paths.VerifiedRecord},
}

// statusDoc is version n of the status document: some 50 KiB, a dozen
// pages, so a torn write shows as pages of two versions.
func statusDoc(n int) status.Document {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	w := make([]string, 12)
	for i := range w {
		var b strings.Builder
		for b.Len() < 4000 {
			fmt.Fprintf(&b, "version %d warning %d word %08x ", n, i, r.Uint32())
		}
		w[i] = b.String()
	}
	return status.Document{
		Phase: status.PhaseConverged, Message: "power-cut version " + strconv.Itoa(n), Warnings: w,
		Role: "control-plane", Member: true, NodeVersion: verifiedVersion(n).String(),
		Time: "2026-01-02T03:04:05Z",
	}
}

func statusBytes(n int) []byte {
	b, err := status.Marshal(statusDoc(n))
	if err != nil {
		panic(err)
	}
	return b
}

func verifiedVersion(n int) version.Version { return version.Version{Major: 1, Minor: 36, Patch: n} }

func verifiedBytes(n int) []byte { return []byte(verifiedVersion(n).String() + "\n") }

// snapName is version n's snapshot name: each is a new file, as every
// real snapshot is (Commit never renames over one).
func snapName(n int) string { return fmt.Sprintf("etcd-00000000000000aa-v1.37-%08d.db", n) }

var snapRE = regexp.MustCompile(`^etcd-00000000000000aa-v1\.37-([0-9]{8})\.db$`)

// snapBytes is version n's snapshot: 256 KiB, random by n.
func snapBytes(n int) []byte {
	b := make([]byte, 256<<10)
	r := rand.New(rand.NewPCG(uint64(n), 2))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	copy(b, fmt.Sprintf("snapshot %d\n", n))
	return b
}

// write makes version n of kind with the provider's writer.
func write(root paths.Root, kind string, n int) error {
	switch kind {
	case kindStatus:
		return status.Write(root, statusDoc(n))
	case kindVerified:
		return reconcile.WriteVerified(root, verifiedVersion(n))
	case kindSnapshot:
		dir, err := fsutil.OpenDirNoFollow(string(root), paths.EtcdBackupDir)
		if err != nil {
			return err
		}
		defer dir.Close()
		// etcdctl's part: the bytes in the .part file, no fsync.
		part := snapName(n) + ".part"
		fd, err := unix.Openat(int(dir.Fd()), part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", part, err)
		}
		f := os.NewFile(uintptr(fd), part)
		if _, err := f.Write(snapBytes(n)); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return etcdsnap.Commit(dir, part, snapName(n))
	}
	return fmt.Errorf("unknown kind %q", kind)
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: powercut init|hold|cut|check ROOT ...")
		os.Exit(2)
	}
	root := paths.Root(os.Args[2])
	arg := func(i int) string {
		if len(os.Args) > i {
			return os.Args[i]
		}
		return ""
	}
	var err error
	switch os.Args[1] {
	case "init":
		err = initRoot(root)
	case "hold":
		err = hold(root, strings.Split(arg(3), ","), arg(4))
	case "cut":
		var delay time.Duration
		if delay, err = time.ParseDuration(arg(4)); err == nil {
			err = cut(root, strings.Split(arg(3), ","), delay, arg(5), arg(6))
		}
	case "check":
		err = check(root)
	case "noise":
		// The highest priority: it runs whenever it can, between any
		// two steps of a writer.
		if err = unix.Setpriority(unix.PRIO_PROCESS, 0, -20); err == nil {
			err = noise(root)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		os.Exit(1)
	}
}

// initRoot writes version 0 of every kind and makes it all durable.
func initRoot(root paths.Root) error {
	if err := fsutil.MkdirAllMode(root.Path(paths.EtcdBackupDir), 0o700); err != nil {
		return err
	}
	for _, k := range kinds {
		if err := write(root, k, 0); err != nil {
			return fmt.Errorf("%s 0: %w", k, err)
		}
	}
	unix.Sync()
	return nil
}

// writeLoop writes versions 1, 2, ... of which, in that order, until done
// says so after a call, telling logf before and after each call.
func writeLoop(root paths.Root, which []string, logf func(format string, a ...any), done func(kind string, n int) bool) error {
	for _, k := range which {
		if !slices.Contains(kinds, k) {
			return fmt.Errorf("unknown kind %q", k)
		}
	}
	for n := 1; ; n++ {
		for _, k := range which {
			logf("START %s %d", k, n)
			if err := write(root, k, n); err != nil {
				return fmt.Errorf("%s %d: %w", k, n, err)
			}
			logf("RETURNED %s %d", k, n)
			if done(k, n) {
				return nil
			}
		}
	}
}

// hold writes until the call at (KIND:N) returned, says HOLD and waits to
// be killed: the guest's /init cuts the power then.
func hold(root paths.Root, which []string, at string) error {
	logf := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	err := writeLoop(root, which, logf, func(k string, n int) bool { return at == fmt.Sprintf("%s:%d", k, n) })
	if err != nil {
		return err
	}
	fmt.Println("HOLD")
	for {
		time.Sleep(time.Hour)
	}
}

// cut writes which, with noise (another process) alongside, and once the
// first call returned and delay passed, loads table for the dm device
// dev: dm-flakey up for its up interval (whole seconds, counted by the
// kernel from the load) and dropping every write after it, a power cut at
// a moment no syscall boundary chose. It goes on writing until well past
// the cut, then prints "CUT-WINDOW FROM TO", the earliest and latest
// moments the cut can have come, and every line with its CLOCK_MONOTONIC
// time (ns).
func cut(root paths.Root, which []string, delay time.Duration, dev, table string) error {
	f := strings.Fields(table)
	if len(f) < 9 || f[2] != "flakey" || f[8] != "drop_writes" {
		return fmt.Errorf("not a dm-flakey drop_writes table: %q", table)
	}
	upSec, err := strconv.Atoi(f[5])
	if err != nil {
		return err
	}
	up := int64(upSec) * int64(time.Second)

	nz := exec.Command("/proc/self/exe", "noise", string(root))
	nz.Stdout, nz.Stderr = os.Stdout, os.Stderr // its ERROR, if any
	if err := nz.Start(); err != nil {
		return err
	}
	defer func() {
		_ = nz.Process.Kill()
		_ = nz.Wait()
	}()
	var (
		mu       sync.Mutex
		lines    []string
		end      atomic.Int64 // when to stop writing: set once the cut is timed
		returned = make(chan struct{})
		once     sync.Once
		written  = make(chan error, 1)
	)
	end.Store(math.MaxInt64)
	logf := func(format string, a ...any) {
		l := fmt.Sprintf(format, a...)
		mu.Lock()
		lines = append(lines, l+" "+strconv.FormatInt(mono(), 10))
		mu.Unlock()
		if strings.HasPrefix(l, "RETURNED ") {
			once.Do(func() { close(returned) })
		}
	}
	go func() {
		written <- writeLoop(root, which, logf, func(string, int) bool { return mono() > end.Load() })
	}()
	// A cut before any call returned would test nothing.
	select {
	case <-returned:
	case err := <-written:
		return fmt.Errorf("no call returned: %v", err)
	case <-time.After(2 * time.Minute):
		return errors.New("no call returned within 2 minutes")
	}
	time.Sleep(delay)
	if err := dmsetup("suspend", "--nolockfs", dev); err != nil {
		return err
	}
	t0, t1, err := load(dev, table)
	if rerr := dmsetup("resume", dev); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	end.Store(t1 + up + int64(300*time.Millisecond))
	err = <-written
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("CUT-WINDOW %d %d\n%s\n", t0+up, t1+up, strings.Join(lines, "\n"))
	return err
}

// noise creates and removes files in a directory of its own and fsyncs
// the directory, over and over, as etcd, containerd and the kubelet do on
// a node: each fsync forces XFS's log, with whatever else it holds
// (another writer's truncation or rename not made durable yet), at
// moments no writer chose. Metadata alone, no data to wait for: the
// forces come often, also while a writer waits for its own data.
func noise(root paths.Root) error {
	dir := root.Path("/noise")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for i := 0; ; i++ {
		name := filepath.Join(dir, strconv.Itoa(i%2))
		f, err := os.Create(name)
		if err != nil {
			return err
		}
		f.Close()
		if err := d.Sync(); err != nil {
			return err
		}
		if err := os.Remove(name); err != nil {
			return err
		}
	}
}

func dmsetup(args ...string) error {
	if out, err := exec.Command("dmsetup", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("dmsetup %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// load loads table for dev, returning the CLOCK_MONOTONIC times just
// before and just after: dmsetup is started first and handed the table on
// its stdin once it waits there, so what lies between is little more
// than the load ioctl (where dm-flakey starts its clock).
func load(dev, table string) (before, after int64, err error) {
	cmd := exec.Command("dmsetup", "load", dev)
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	// read(2) on fd 0: /proc/PID/syscall starts "0 0x0 ".
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", cmd.Process.Pid)); strings.HasPrefix(string(b), "0 0x0 ") {
			break
		}
		if time.Now().After(deadline) {
			in.Close()
			_ = cmd.Wait()
			return 0, 0, fmt.Errorf("dmsetup load did not read its table from stdin within 30s: %s", out.Bytes())
		}
	}
	before = mono()
	_, err = io.WriteString(in, table+"\n")
	if cerr := in.Close(); err == nil {
		err = cerr
	}
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	after = mono()
	if err != nil {
		return 0, 0, fmt.Errorf("dmsetup load %s: %w: %s", dev, err, out.Bytes())
	}
	return before, after, nil
}

func mono() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// check reports what each file holds.
func check(root paths.Root) error {
	for _, c := range checked {
		fmt.Printf("STATE %s %s\n", c.name, state(root, c.name, c.path))
	}
	dir, err := fsutil.OpenDirNoFollow(string(root), paths.EtcdBackupDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	ents, err := fsutil.ReadDirAtMost(dir, 10000)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".part") {
			var st unix.Stat_t
			_ = unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
			fmt.Printf("PART %s %d\n", name, st.Size)
			continue
		}
		m := snapRE.FindStringSubmatch(name)
		if m == nil {
			fmt.Printf("STATE %s bad not a snapshot's name\n", name)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		fmt.Printf("STATE snapshot-%d %s\n", n, snapState(root, name, n))
	}
	return nil
}

func state(root paths.Root, name, p string) string {
	b, err := fsutil.ReadFileNoFollow(root.Path(p), status.MaxSize)
	switch {
	case err != nil:
		return "bad unreadable: " + err.Error()
	case len(b) == 0:
		return "bad empty"
	}
	var n int
	var want []byte
	if name == "verified" {
		v, err := version.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Sprintf("bad %d bytes that are no version: %v", len(b), err)
		}
		n, want = v.Patch, verifiedBytes(v.Patch)
	} else {
		// As the next pass reads the mirror.
		doc, err := status.ReadTrusted(root, p)
		if err != nil {
			return fmt.Sprintf("bad %d bytes that do not parse: %v", len(b), err)
		}
		if _, err := fmt.Sscanf(doc.Message, "power-cut version %d", &n); err != nil {
			return fmt.Sprintf("bad %d bytes with message %.40q", len(b), doc.Message)
		}
		want = statusBytes(n)
	}
	if !bytes.Equal(b, want) {
		return fmt.Sprintf("bad torn: %d bytes, version %d has %d", len(b), n, len(want))
	}
	return strconv.Itoa(n)
}

func snapState(root paths.Root, name string, n int) string {
	p := filepath.Join(paths.EtcdBackupDir, name)
	want := snapBytes(n)
	b, err := fsutil.ReadFileNoFollow(root.Path(p), int64(len(want)))
	switch {
	case err != nil:
		return "bad unreadable: " + err.Error()
	case len(b) == 0:
		return "bad empty"
	case !bytes.Equal(b, want):
		return fmt.Sprintf("bad torn: %d bytes, want %d", len(b), len(want))
	}
	var st unix.Stat_t
	if err := unix.Stat(root.Path(p), &st); err != nil || st.Mode&0o7777 != 0o600 {
		return fmt.Sprintf("bad mode %04o, want 0600", st.Mode&0o7777)
	}
	return strconv.Itoa(n)
}
