package main

// A power cut during the writes the provider promises are atomic, on a real
// kernel: a Debian kernel under QEMU (TCG) boots an initramfs holding this
// package's program (main.go), busybox, dmsetup and mkfs.xfs. Its /init
// puts XFS on a dm-flakey device and, round after round, writes version 0
// of every file (synced), has the program write versions 1, 2, ... with the
// provider's real writers and cuts the power: the device's table drops
// every write from then on, so what the page cache still held is lost when
// the filesystem is unmounted (xfstests' _flakey_drop_and_remount); the
// table allows writes again and the filesystem is mounted again (XFS
// replays its log). Then every file must be the old version or a whole new
// one, never empty or torn, and never older than what a call had returned
// before the cut: the durability its fsyncs promise.
//
// Two kinds of cut. A durable-* round cuts right after a call returned,
// that call the last one made (any later fsync would force XFS's log, and
// a rename not made durable with it): the new version must be there. A
// cut-* round has the kernel cut (dm-flakey's up interval ends) at a moment
// no syscall boundary chose, while the writer writes and another process
// fsyncs files of its own, as etcd and the kubelet do on a node, forcing
// XFS's log at moments of their own. A dm-delay device between XFS and the
// cut holds every write 20 ms, as a slow disk would: a writer's data is
// long in flight while those fsyncs make its other changes durable (a
// truncation, say), the moments a write that is not atomic shows torn.
//
// XFS because, unlike ext4 (auto_da_alloc), it has no heuristic that
// flushes a file renamed over another: a missing fsync shows as an empty
// file. A SIGKILL (the end-to-end suite's) keeps the page cache, so only a
// cut below the filesystem tests the fsyncs.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/vmtest"
)

// A round is one power cut.
type round struct {
	name  string
	kinds string // what is written, in this order
	hold  string // KIND:N: the cut right after that call returned
	delay string // else the cut is timed by the kernel, 1 s after the table's load, loaded delay after the first call returned
}

const guestSetup = `export DM_DISABLE_UDEV=1
truncate -s 512M /tmp/disk.img || fail truncate
L=$(losetup -f) && losetup $L /tmp/disk.img || fail losetup
S=$(blockdev --getsz $L) || fail blockdev
UP="0 $S flakey $L 0 180 0"
CUT="0 $S flakey $L 0 0 180 1 drop_writes"
TIMED="0 $S flakey $L 0 1 180 1 drop_writes"
dmsetup create pc --table "$UP" || fail dmsetup create
# As xfstests' _load_flakey_table: no filesystem freeze (it would sync).
table() { dmsetup suspend --nolockfs pc && dmsetup load pc --table "$1" && dmsetup resume pc; }
mkfs.xfs -q /dev/mapper/pc || fail mkfs.xfs
# Above the cut, every write held 20 ms (reads not): a slow disk, a
# writer's data long in flight. One held at the cut is lost with the rest.
dmsetup create pcd --table "0 $S delay /dev/mapper/pc 0 0 /dev/mapper/pc 0 20" || fail dmsetup create delay
mkdir -p /mnt/pc
echo "GUEST: $(dmsetup table pc), up $(cut -d' ' -f1 /proc/uptime)s"
start() { # NAME
  mount -t xfs /dev/mapper/pcd /mnt/pc || fail mount $1
  /powercut init /mnt/pc > /tmp/init.out 2>&1 || { cat /tmp/init.out; fail init $1; }
  LOG=/tmp/write-$1.log # one per round: a round never reads another's HOLD
}
# What the page cache held is lost: unmounted while every write is dropped.
finish() { # NAME
  table "$CUT" || fail cut $1
  sed "s/^/PC-$1-LOG: /" $LOG
  [ -z "$W" ] || { kill -KILL $W; wait $W; W=; }
  umount /mnt/pc || fail umount $1
  table "$UP" || fail uncut $1
  mount -t xfs /dev/mapper/pcd /mnt/pc || fail remount $1
  /powercut check /mnt/pc 2>&1 | sed "s/^/PC-$1: /"
  rm -rf /mnt/pc/run /mnt/pc/usr /mnt/pc/noise && umount /mnt/pc || fail clean $1
  echo "GUEST: round $1 done, up $(cut -d' ' -f1 /proc/uptime)s"
}
hold() { # NAME KINDS KIND:N
  start $1
  /powercut hold /mnt/pc $2 $3 > $LOG 2>&1 &
  W=$!
  i=0
  until grep -q '^HOLD' $LOG; do
    i=$((i+1)); [ $i -lt 1200 ] || { cat $LOG; fail no HOLD in round $1; }
    kill -0 $W 2>/dev/null || break
    sleep 0.1
  done
  kill -STOP $W
  finish $1
}
timed() { # NAME KINDS DELAY
  start $1
  /powercut cut /mnt/pc $2 $3 pc "$TIMED" > $LOG 2>&1
  finish $1
}
`

func TestPowerCut(t *testing.T) {
	h := vmtest.Find(t, "busybox", "dmsetup", "mkfs.xfs")
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prog := filepath.Join(work, "powercut")
	if err := testbin.BuildStatic(ctx, "./tests/powercut", prog); err != nil {
		t.Fatal(err)
	}

	all := strings.Join(kinds, ",")
	rounds := []round{
		// Durability: the cut right after a call returned, that kind's
		// call the last one made (a later fsync would force XFS's log,
		// the earlier rename with it).
		{name: "durable-status", kinds: all, hold: kindStatus + ":3"},
		{name: "durable-verified", kinds: all, hold: kindVerified + ":3"},
		{name: "durable-snapshot", kinds: all, hold: kindSnapshot + ":3"},
	}
	// Atomicity: cuts at random moments, most of them during a call of
	// the one kind being written.
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 0))
	for _, k := range []string{kindStatus, kindVerified, kindSnapshot, all} {
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("cut-%s-%d", strings.ReplaceAll(k, ",", "+"), i)
			rounds = append(rounds, round{name: name, kinds: k, delay: fmt.Sprintf("%dms", r.IntN(250))})
		}
	}
	t.Logf("random write delays from seed %d", seed)
	var script strings.Builder
	script.WriteString(vmtest.Prelude + guestSetup)
	for _, rd := range rounds {
		if rd.hold != "" {
			fmt.Fprintf(&script, "hold %s %s %s\n", rd.name, rd.kinds, rd.hold)
		} else {
			fmt.Fprintf(&script, "timed %s %s %s\n", rd.name, rd.kinds, rd.delay)
		}
	}
	script.WriteString("report 0\n")

	ird := vmtest.NewInitramfs()
	ird.File("/init", []byte(script.String()), 0o755)
	ird.Copy(t, "/powercut", prog)
	ird.Busybox(t, ctx, h.Tools["busybox"])
	for _, name := range []string{"dmsetup", "mkfs.xfs"} {
		ird.CopyWithLibs(t, ctx, "/sbin/"+name, h.Tools[name])
	}
	// crc32c first: libcrc32c (xfs) asks the crypto API for it at load.
	ird.Modules(t, h, []string{"crc32c_generic", "crc32c-intel", "dm-flakey", "dm-delay", "loop", "xfs"})

	res := vmtest.Boot{}.Run(t, ctx, h, ird, work)
	lines := map[string][]string{} // by round ("NAME" and "NAME-LOG")
	for _, l := range strings.Split(res.Console, "\n") {
		l = strings.TrimRight(l, "\r")
		if strings.HasPrefix(l, "GUEST") {
			t.Log(l)
		}
		if k, v, ok := strings.Cut(l, ": "); ok && strings.HasPrefix(k, "PC-") {
			lines[strings.TrimPrefix(k, "PC-")] = append(lines[strings.TrimPrefix(k, "PC-")], v)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within its budget:\n%s", vmtest.Tail(res.Console, 60))
	}
	if g := res.Guest(); g != 0 {
		t.Fatalf("guest reported %d (qemu exit %d), want 0:\n%s", g, res.QEMUExit, vmtest.Tail(res.Console, 80))
	}
	for _, rd := range rounds {
		checkRound(t, rd, lines[rd.name+"-LOG"], lines[rd.name])
	}
}

// checkRound checks one round's files against what its writer had started
// and seen returned before the cut.
func checkRound(t *testing.T, rd round, log, states []string) {
	t.Helper()
	failed := false
	errorf := func(format string, a ...any) {
		t.Helper()
		failed = true
		t.Errorf(format, a...)
	}
	defer func() {
		if failed {
			t.Logf("%s: the files after the cut:\n%s", rd.name, strings.Join(states, "\n"))
		}
	}()
	// A call counts as returned before the cut when it returned before the
	// earliest moment the cut can have come, as started when it started
	// before the latest (the kernel counts in jiffies: a margin).
	const margin = int64(20 * time.Millisecond)
	started, returned := map[string]int{}, map[string]int{}
	held := false
	var from, to int64 = math.MaxInt64, math.MaxInt64
	for _, l := range log {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "CUT-WINDOW" {
			from, _ = strconv.ParseInt(f[1], 10, 64)
			to, _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
	for _, l := range log {
		f := strings.Fields(l)
		var at int64 = math.MinInt64 // a hold round's lines: all before the cut
		if len(f) == 4 && (f[0] == "START" || f[0] == "RETURNED") {
			at, _ = strconv.ParseInt(f[3], 10, 64)
			f = f[:3]
		}
		n := 0
		if len(f) == 3 {
			n, _ = strconv.Atoi(f[2])
		}
		switch {
		case len(f) == 3 && f[0] == "CUT-WINDOW":
		case len(f) == 3 && f[0] == "START":
			if at < to+margin {
				started[f[1]] = n
			}
		case len(f) == 3 && f[0] == "RETURNED":
			if at < from-margin {
				returned[f[1]] = n
			}
		case l == "HOLD":
			held = true
		default:
			errorf("%s: the writer printed %q", rd.name, l)
		}
	}
	if rd.hold == "" && from == math.MaxInt64 {
		errorf("%s: no CUT-WINDOW: the writer did not cut", rd.name)
	}
	var inFlight []string
	for _, k := range kinds {
		if started[k] > returned[k] {
			inFlight = append(inFlight, fmt.Sprintf("%s %d", k, started[k]))
		}
	}
	if rd.hold == "" {
		t.Logf("%s: cut after %v returned, during %v (the cut's moment known within %s)", rd.name, returned, inFlight, time.Duration(to-from+2*margin))
	} else {
		t.Logf("%s: cut after %v returned, during %v", rd.name, returned, inFlight)
	}
	if rd.hold != "" {
		k, n, _ := strings.Cut(rd.hold, ":")
		if want, _ := strconv.Atoi(n); !held || returned[k] != want || len(inFlight) != 0 {
			errorf("%s: the writer did not hold right after %s returned (held %v, returned %v, in flight %v)", rd.name, rd.hold, held, returned, inFlight)
		}
	} else if len(returned) == 0 {
		errorf("%s: no call returned before the cut: it tested nothing", rd.name)
	}

	seen := map[string]bool{}
	snaps := map[int]bool{}
	for _, l := range states {
		f := strings.SplitN(l, " ", 3)
		if len(f) == 3 && f[0] == "PART" {
			t.Logf("%s: left over: %s", rd.name, l) // removed by the next write
			continue
		}
		if len(f) != 3 || f[0] != "STATE" {
			errorf("%s: the check printed %q", rd.name, l)
			continue
		}
		file, got := f[1], f[2]
		seen[file] = true
		kind := kindStatus
		switch {
		case file == "verified":
			kind = kindVerified
		case strings.HasPrefix(file, "snapshot-"):
			kind = kindSnapshot
		}
		v, err := strconv.Atoi(got)
		if err != nil {
			errorf("%s: after the cut %s is %s (the writer had returned %s %d, started %d)", rd.name, file, got, kind, returned[kind], started[kind])
			continue
		}
		if kind == kindSnapshot {
			snaps[v] = true
			if v > started[kind] {
				errorf("%s: snapshot %d exists, but only %d was started", rd.name, v, started[kind])
			}
			continue
		}
		if v < returned[kind] || v > started[kind] {
			errorf("%s: after the cut %s is version %d, want %d (returned) to %d (started)", rd.name, file, v, returned[kind], started[kind])
		}
	}
	for _, c := range checked {
		if !seen[c.name] {
			errorf("%s: no state for %s", rd.name, c.name)
		}
	}
	for n := 0; n <= returned[kindSnapshot]; n++ {
		if !snaps[n] {
			errorf("%s: snapshot %d was committed (Commit returned) but is not there whole after the cut", rd.name, n)
		}
	}
}
