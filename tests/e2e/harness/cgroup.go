package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
)

// hierarchy is one mounted cgroup hierarchy and this process's place in it.
type hierarchy struct {
	Mount  string // where it is mounted ("/sys/fs/cgroup/memory")
	Parent string // this process's cgroup in it, relative to the mount ("/process_api/x", "/")
	V2     bool
	Names  []string // controllers or name=X (v1); empty for v2
}

// Dir is the node subtree's directory in this hierarchy.
func (h hierarchy) Dir(name string) string {
	return filepath.Join(h.Mount, h.Parent, name)
}

// parseHierarchies reads /proc/self/mountinfo and /proc/self/cgroup: every
// cgroup hierarchy mounted under /sys/fs/cgroup, with this process's cgroup
// in it. Each node gets a subtree in every one of them (on a cgroup v1 host
// nspawn's cgroup namespace roots each hierarchy at the process's cgroup, so
// two nodes in one cgroup would share their kubepods trees).
func parseHierarchies(mountinfo, selfCgroup string) ([]hierarchy, error) {
	type own struct {
		names []string
		path  string
	}
	var v1 []own
	v2Path := ""
	haveV2 := false
	for _, line := range strings.Split(selfCgroup, "\n") {
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("cgroup line %q: malformed", line)
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path, haveV2 = parts[2], true
			continue
		}
		if parts[1] == "" {
			continue
		}
		v1 = append(v1, own{names: strings.Split(parts[1], ","), path: parts[2]})
	}
	mounts, err := cryptgate.ParseMountinfo([]byte(mountinfo))
	if err != nil {
		return nil, err
	}
	seen := map[cryptgate.Dev]bool{}
	var out []hierarchy
	for _, m := range mounts {
		fstype, mnt, root, dev := m.FSType, m.MountPoint, m.Root, m.Dev
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		if mnt != "/sys/fs/cgroup" && !strings.HasPrefix(mnt, "/sys/fs/cgroup/") {
			continue
		}
		if seen[dev] {
			continue
		}
		rel := func(p string) string {
			if root == "/" {
				return p
			}
			r := strings.TrimPrefix(p, root)
			if r == p && p != root {
				return "" // this process is outside the mounted subtree
			}
			if r == "" {
				r = "/"
			}
			return r
		}
		if fstype == "cgroup2" {
			if !haveV2 {
				continue
			}
			p := rel(v2Path)
			if p == "" {
				continue
			}
			seen[dev] = true
			out = append(out, hierarchy{Mount: mnt, Parent: p, V2: true})
			continue
		}
		opts := map[string]bool{}
		for _, o := range strings.Split(m.SuperOptions, ",") {
			opts[o] = true
		}
		for _, o := range v1 {
			match := true
			for _, n := range o.names {
				if !opts[n] {
					match = false
					break
				}
			}
			if !match {
				continue
			}
			p := rel(o.path)
			if p == "" {
				break
			}
			seen[dev] = true
			out = append(out, hierarchy{Mount: mnt, Parent: p, Names: o.names})
			break
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Mount < out[j].Mount })
	return out, nil
}

func hostHierarchies() ([]hierarchy, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	return parseHierarchies(string(mi), string(cg))
}

// createCgroups makes the node's subtree in every hierarchy and returns the
// cgroup.procs files a process writes itself into.
func createCgroups(hs []hierarchy, name string) ([]string, error) {
	var procs []string
	for _, h := range hs {
		d := h.Dir(name)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("cgroup %s: %w", d, err)
		}
		if isCpuset(h) {
			// A v1 cpuset cgroup takes no task before it has cpus and mems.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := inheritedValue(filepath.Join(h.Mount, h.Parent), h.Mount, f)
				if err != nil {
					return nil, err
				}
				if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0o644); err != nil {
					return nil, fmt.Errorf("cgroup %s/%s: %w", d, f, err)
				}
			}
		}
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	return procs, nil
}

func isCpuset(h hierarchy) bool {
	for _, n := range h.Names {
		if n == "cpuset" {
			return true
		}
	}
	return false
}

// inheritedValue reads file from dir or the nearest ancestor (up to mount)
// where it is not empty.
func inheritedValue(dir, mount, file string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, file))
		if err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b)), nil
		}
		if d == mount || d == "/" || d == "." {
			return "", fmt.Errorf("cgroup: no %s set at or above %s", file, dir)
		}
	}
}

// cgroupPIDs lists every process in the node's subtree, in every hierarchy.
func cgroupPIDs(hs []hierarchy, name string) []int {
	set := map[int]bool{}
	for _, h := range hs {
		_ = filepath.WalkDir(h.Dir(name), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			f, err := os.Open(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 0 {
					set[pid] = true
				}
			}
			f.Close()
			return nil
		})
	}
	out := make([]int, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// removeCgroupDir removes a subtree depth-first (kubelet and systemd nest
// their own cgroups in it). Directories that still hold processes stay.
func removeCgroupDir(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// peakMemory is the subtree's peak memory use in bytes (0 when unknown).
func peakMemory(hs []hierarchy, name string) uint64 {
	for _, h := range hs {
		var f string
		switch {
		case h.V2:
			f = "memory.peak"
		case len(h.Names) == 1 && h.Names[0] == "memory":
			f = "memory.max_usage_in_bytes"
		default:
			continue
		}
		b, err := os.ReadFile(filepath.Join(h.Dir(name), f))
		if err != nil {
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v
		}
	}
	return 0
}
