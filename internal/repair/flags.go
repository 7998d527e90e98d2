// Package repair brings a kubelet broken by the A/B image swap back with
// kubeadm init phase kubelet-start, after naming every kubelet flag the
// target minor removed that kubelet-start will not fix.
package repair

import (
	"bufio"
	"bytes"
	"errors"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// RemovedFlag is a kubelet flag removed in a minor.
type RemovedFlag struct {
	Minor  version.Minor
	Flag   string // "--name"
	Prefix bool   // Flag is a prefix ("--storage-driver-")
}

// RemovedFlags is the table (../shared/spec/NOTES.md): a kubelet of minor M
// refuses to start ("unknown flag") on any flag removed at or before M.
var RemovedFlags = []RemovedFlag{
	{Minor: version.Minor{Major: 1, Minor: 35}, Flag: "--pod-infra-container-image"},
	{Minor: version.Minor{Major: 1, Minor: 37}, Flag: "--containerd"},
	{Minor: version.Minor{Major: 1, Minor: 37}, Flag: "--containerd-namespace"},
	{Minor: version.Minor{Major: 1, Minor: 37}, Flag: "--boot-id-file"},
	{Minor: version.Minor{Major: 1, Minor: 37}, Flag: "--machine-id-file"},
	{Minor: version.Minor{Major: 1, Minor: 37}, Flag: "--storage-driver-", Prefix: true},
}

// Finding is one offending flag in one file.
type Finding struct {
	File  string // host path
	Flag  string // as written, without its value
	Minor version.Minor
	// FixedByRepair is true for kubeadm-flags.env, which kubelet-start rewrites.
	FixedByRepair bool
}

// KubeadmFlagsEnv is the file kubeadm writes (and kubelet-start rewrites).
const KubeadmFlagsEnv = "/var/lib/kubelet/kubeadm-flags.env"

// KubeletFlagFiles are the places kubelet flags live outside kubeadm's file.
var KubeletFlagFiles = []string{"/etc/default/kubelet", "/etc/sysconfig/kubelet"}

// KubeletDropInDirs hold kubelet unit drop-ins.
var KubeletDropInDirs = []string{
	"/etc/systemd/system/kubelet.service.d",
	"/run/systemd/system/kubelet.service.d",
	"/usr/lib/systemd/system/kubelet.service.d",
}

// RemovedIn returns the table entry a flag matches for a kubelet of target's minor.
func RemovedIn(flag string, target version.Minor) (RemovedFlag, bool) {
	for _, r := range RemovedFlags {
		if r.Minor.Major != target.Major || r.Minor.Minor > target.Minor {
			continue
		}
		if flag == r.Flag || (r.Prefix && strings.HasPrefix(flag, r.Flag)) {
			return r, true
		}
	}
	return RemovedFlag{}, false
}

// ScanText finds removed flags in the text of an env file, a drop-in or a
// command line: every word starting with "--" counts, its value cut at "=".
func ScanText(text []byte, target version.Minor) []string {
	var found []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		for _, w := range strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' || r == '"' || r == '\'' }) {
			i := strings.Index(w, "--")
			if i < 0 {
				continue
			}
			f := w[i:]
			if j := strings.IndexByte(f, '='); j >= 0 {
				f = f[:j]
			}
			if _, ok := RemovedIn(f, target); ok && !seen[f] {
				seen[f] = true
				found = append(found, f)
			}
		}
	}
	return found
}

// Scan reads every kubelet flag file under root and reports removed flags
// for a kubelet of target's minor. Unreadable files (a symlink, too large)
// are skipped: this is advice, not a gate.
func Scan(root paths.Root, target version.Minor) []Finding {
	files := append([]string{KubeadmFlagsEnv}, KubeletFlagFiles...)
	for _, d := range KubeletDropInDirs {
		ents, err := fsutil.ReadDir(root.Path(d))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".conf") {
				files = append(files, filepath.Join(d, e.Name()))
			}
		}
	}
	var out []Finding
	for _, f := range files {
		b, err := fsutil.ReadFileNoFollow(root.Path(f), 1<<20)
		if err != nil {
			continue
		}
		for _, flag := range ScanText(b, target) {
			r, _ := RemovedIn(flag, target)
			out = append(out, Finding{File: f, Flag: flag, Minor: r.Minor, FixedByRepair: f == KubeadmFlagsEnv})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out
}

// CgroupV1 reports whether /sys/fs/cgroup is not a cgroup2 mount, from the
// mountinfo text (cgroup v1 and hybrid hosts mount a tmpfs there).
func CgroupV1(mountinfo []byte) (bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	v1 := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// id parent maj:min root mountpoint options [optional...] - fstype source superopts
		if len(f) < 7 || f[4] != "/sys/fs/cgroup" {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) {
			continue
		}
		found = true
		v1 = f[sep+1] != "cgroup2" // the last mount at the point wins
	}
	if !found {
		return false, errors.New("/sys/fs/cgroup is not mounted")
	}
	return v1, nil
}
