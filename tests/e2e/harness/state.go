package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StateDir holds the harness's records of host state it changed: which
// clusters own which network namespaces, cgroups and containers, and the
// host sysctls' original values with who holds them. It lets a later run
// undo what a killed test binary left behind.
var StateDir = "/run/provider-kubernetes-e2e"

// HostSysctls are the host (not namespaced) sysctls kubelet insists on and
// cannot write from inside nspawn. They are set while any cluster is up and
// put back afterwards.
var HostSysctls = []Sysctl{
	{Key: "kernel.panic", Value: "10"},
	{Key: "kernel.panic_on_oops", Value: "1"},
	{Key: "vm.overcommit_memory", Value: "1"},
}

// Sysctl is one key and value.
type Sysctl struct{ Key, Value string }

func sysctlPath(key string) string {
	return "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
}

// holder identifies a live process across PID reuse.
type holder struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/PID/stat starttime
}

func self() holder {
	pid := os.Getpid()
	st, _ := procStart(pid)
	return holder{PID: pid, Start: st}
}

// alive reports whether h is still the same running process.
func alive(h holder) bool {
	st, err := procStart(h.PID)
	return err == nil && st == h.Start
}

// sysctlRecord is what is on disk while anyone holds the host sysctls.
type sysctlRecord struct {
	BootID  string            `json:"bootID"`
	Orig    map[string]string `json:"orig"`
	Holders []holder          `json:"holders"`
}

// planAcquire decides the record after me takes the sysctls. Originals are
// taken from the host only when no record survives from this boot: a record
// whose holders all died still has the true originals (the host now shows
// ours).
func planAcquire(rec *sysctlRecord, bootID string, current map[string]string, me holder, isAlive func(holder) bool) sysctlRecord {
	if rec == nil || rec.BootID != bootID {
		orig := map[string]string{}
		for k, v := range current {
			orig[k] = v
		}
		return sysctlRecord{BootID: bootID, Orig: orig, Holders: []holder{me}}
	}
	out := sysctlRecord{BootID: rec.BootID, Orig: rec.Orig}
	for _, h := range rec.Holders {
		if h != me && isAlive(h) {
			out.Holders = append(out.Holders, h)
		}
	}
	out.Holders = append(out.Holders, me)
	return out
}

// planRelease decides the record after me lets go: nil and the originals to
// restore when nobody alive holds them any more.
func planRelease(rec *sysctlRecord, bootID string, me holder, isAlive func(holder) bool) (*sysctlRecord, map[string]string) {
	if rec == nil || rec.BootID != bootID {
		return nil, nil // the host rebooted since: its sysctls are its defaults again
	}
	out := sysctlRecord{BootID: rec.BootID, Orig: rec.Orig}
	for _, h := range rec.Holders {
		if h != me && isAlive(h) {
			out.Holders = append(out.Holders, h)
		}
	}
	if len(out.Holders) == 0 {
		return nil, rec.Orig
	}
	return &out, nil
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

func readSysctls() (map[string]string, error) {
	m := map[string]string{}
	for _, s := range HostSysctls {
		b, err := os.ReadFile(sysctlPath(s.Key))
		if err != nil {
			return nil, err
		}
		m[s.Key] = strings.TrimSpace(string(b))
	}
	return m, nil
}

func writeSysctls(m map[string]string) error {
	var errs []error
	for _, s := range HostSysctls {
		v, ok := m[s.Key]
		if !ok {
			continue
		}
		if err := os.WriteFile(sysctlPath(s.Key), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s=%s: %w", s.Key, v, err))
		}
	}
	return errors.Join(errs...)
}

func sysctlRecordPath() string { return filepath.Join(StateDir, "host-sysctls.json") }

func withStateLock(fn func() error) error {
	if err := os.MkdirAll(StateDir, 0o700); err != nil {
		return err
	}
	unlock, err := flock(filepath.Join(StateDir, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

func loadJSON(path string, v any) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}

func saveJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".part"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// acquireSysctls sets HostSysctls, recording the originals.
func acquireSysctls() error {
	return withStateLock(func() error {
		var rec sysctlRecord
		ok, err := loadJSON(sysctlRecordPath(), &rec)
		if err != nil {
			return err
		}
		cur, err := readSysctls()
		if err != nil {
			return err
		}
		var prev *sysctlRecord
		if ok {
			prev = &rec
		}
		next := planAcquire(prev, bootID(), cur, self(), alive)
		if err := saveJSON(sysctlRecordPath(), next); err != nil {
			return err
		}
		want := map[string]string{}
		for _, s := range HostSysctls {
			want[s.Key] = s.Value
		}
		return writeSysctls(want)
	})
}

// releaseSysctls puts the originals back when this was the last holder.
func releaseSysctls() error {
	return withStateLock(func() error {
		var rec sysctlRecord
		ok, err := loadJSON(sysctlRecordPath(), &rec)
		if err != nil || !ok {
			return err
		}
		next, restore := planRelease(&rec, bootID(), self(), alive)
		if next != nil {
			return saveJSON(sysctlRecordPath(), next)
		}
		if restore != nil {
			if err := writeSysctls(restore); err != nil {
				return err
			}
		}
		return os.Remove(sysctlRecordPath())
	})
}

// procStat is the part of /proc/PID/stat the harness reads.
type procStat struct {
	Comm  string
	PPID  int
	Start uint64
}

// parseProcStat parses /proc/PID/stat ("pid (comm) state ppid ... starttime
// ..."); comm may hold spaces and parentheses, so fields count from the last ')'.
func parseProcStat(s string) (procStat, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("proc stat %q: malformed", s)
	}
	rest := strings.Fields(s[end+1:])
	// rest[0] is state (field 3); ppid is field 4; starttime field 22.
	if len(rest) < 20 {
		return procStat{}, fmt.Errorf("proc stat: %d fields after comm", len(rest))
	}
	ppid, err := strconv.Atoi(rest[1])
	if err != nil {
		return procStat{}, err
	}
	start, err := strconv.ParseUint(rest[19], 10, 64)
	if err != nil {
		return procStat{}, err
	}
	return procStat{Comm: s[open+1 : end], PPID: ppid, Start: start}, nil
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

func procStart(pid int) (uint64, error) {
	st, err := readProcStat(pid)
	return st.Start, err
}

// childNamed finds a child of ppid whose comm is name (0 when none).
func childNamed(ppid int, name string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err == nil && st.PPID == ppid && st.Comm == name {
			return pid
		}
	}
	return 0
}
