package restore

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/bundle"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// What collect-manifests does: a rollback puts back the static pod
// manifests a control plane ran before the upgrade. kubeadm upgrade apply
// and upgrade node move each manifest they replace into a fresh
// /etc/kubernetes/tmp/kubeadm-backup-manifests-<time> directory, one
// component at a time and a new directory per run, and keep them. An
// upgrade cut short and run again (a crash, a reboot mid-apply) leaves the
// pre-upgrade manifests spread over several of those directories, next to
// copies of the new version's; picking by hand is where a restore goes
// wrong. CollectManifests picks, for each component, the newest saved copy
// at the version to go back to, and copies them into one directory for
// restore-etcd --manifests.

// Components are the static pods of a stacked control plane, by manifest name.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// BackupManifestsPrefix names kubeadm's saved manifests directories.
const BackupManifestsPrefix = "kubeadm-backup-manifests-"

// ErrNoSavedManifest: a component has no saved copy at the version asked.
var ErrNoSavedManifest = errors.New("no saved manifest")

// ErrCollectTarget: the directory to collect into cannot be used.
var ErrCollectTarget = errors.New("collect target")

// Saved is one manifest kubeadm saved: its directory (host path), its
// file name (etcd.yaml, ...) and the image tag of its container.
type Saved struct {
	Dir, File, Tag string
	data           []byte // the bytes the tag was read from: what is copied
}

// Want is the version to go back to: the control plane's Kubernetes
// version and the etcd image tag that version's kubeadm deploys.
type Want struct {
	Kubernetes version.Version
	EtcdTag    string
}

// ChooseSaved picks, for each component, the copy in the newest directory
// (kubeadm names them by time) whose image is the wanted version, and
// names every component that has none.
func ChooseSaved(saved []Saved, w Want) (map[string]Saved, error) {
	s := append([]Saved(nil), saved...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].Dir > s[j].Dir })
	out := map[string]Saved{}
	var missing []string
	for _, c := range Components {
		file := c + ".yaml"
		var seen []string
		for _, x := range s {
			if x.File != file {
				continue
			}
			if matches(c, x.Tag, w) {
				out[c] = x
				break
			}
			seen = append(seen, x.Tag+" in "+path.Base(x.Dir))
		}
		if _, ok := out[c]; !ok {
			want := w.Kubernetes.String()
			if c == "etcd" {
				want = w.EtcdTag
			}
			found := "none saved"
			if len(seen) > 0 {
				found = "saved: " + strings.Join(seen, ", ")
			}
			missing = append(missing, fmt.Sprintf("%s at %s (%s)", file, want, found))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoSavedManifest, strings.Join(missing, "; "))
	}
	return out, nil
}

func matches(component, tag string, w Want) bool {
	if component == "etcd" {
		return tag != "" && tag == w.EtcdTag
	}
	v, err := version.ParseReported(tag)
	return err == nil && v == w.Kubernetes
}

// Collected is what CollectManifests copied.
type Collected struct {
	Want Want
	To   string
	// From is each component's chosen copy.
	From map[string]Saved
}

// WantFromBundle is the version of the booted image: what a rollback boots.
func WantFromBundle(root paths.Root) (Want, error) {
	b, err := fsutil.ReadFileNoFollow(root.Path(paths.BundleManifest), 1<<20)
	if err != nil {
		return Want{}, err
	}
	m, err := bundle.Parse(b)
	if err != nil {
		return Want{}, fmt.Errorf("%s: %w", paths.BundleManifest, err)
	}
	if m.Etcd == "" {
		return Want{}, fmt.Errorf("%s names no etcd", paths.BundleManifest)
	}
	return Want{Kubernetes: m.KubeadmVersion(), EtcdTag: m.Etcd}, nil
}

// ListSaved reads every manifest in kubeadm's saved manifests directories.
// A directory or file that is not a plain root-owned one is skipped, with
// why, in skipped.
func ListSaved(root paths.Root) (saved []Saved, skipped []string, err error) {
	ents, err := fsutil.ReadDir(root.Path(paths.KubeadmTmpDir))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), BackupManifestsPrefix) {
			continue
		}
		dir := paths.KubeadmTmpDir + "/" + e.Name()
		if !e.IsDir() {
			skipped = append(skipped, dir+": not a directory")
			continue
		}
		files, err := fsutil.ReadDir(root.Path(dir))
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		for _, f := range files {
			c, ok := strings.CutSuffix(f.Name(), ".yaml")
			if !ok || !isComponent(c) {
				continue
			}
			b, err := fsutil.ReadFileTrusted(string(root), dir+"/"+f.Name(), 1<<20)
			if err != nil {
				skipped = append(skipped, err.Error())
				continue
			}
			img, err := observe.ManifestImage(b, c)
			if err != nil {
				skipped = append(skipped, fmt.Sprintf("%s/%s: %v", dir, f.Name(), err))
				continue
			}
			saved = append(saved, Saved{Dir: dir, File: f.Name(), Tag: observe.ImageTag(img), data: b})
		}
	}
	return saved, skipped, nil
}

func isComponent(c string) bool {
	for _, x := range Components {
		if x == c {
			return true
		}
	}
	return false
}

// CollectManifests copies the chosen copies into to (a host path; it must
// not exist or be empty; made a 0700 directory by fsutil.EnsureDir, which
// never reuses one another user owns or can write), each 0600 as kubeadm
// writes them, byte for byte what the choice was made on. Nothing is
// copied unless every component has one.
func CollectManifests(root paths.Root, w Want, to string) (Collected, error) {
	c := Collected{Want: w, To: to}
	if !path.IsAbs(to) || path.Clean(to) != to {
		return c, fmt.Errorf("%w: %q is not a clean absolute path", ErrCollectTarget, to)
	}
	if to == paths.ManifestsDir || strings.HasPrefix(paths.ManifestsDir+"/", to+"/") {
		return c, fmt.Errorf("%w: %s would hold the kubelet's manifests directory: collect elsewhere, then copy them in", ErrCollectTarget, to)
	}
	saved, skipped, err := ListSaved(root)
	if err != nil {
		return c, err
	}
	c.From, err = ChooseSaved(saved, w)
	if err != nil {
		if len(skipped) > 0 {
			err = fmt.Errorf("%w (skipped: %s)", err, strings.Join(skipped, "; "))
		}
		return c, err
	}
	// Every component of to is resolved beneath the root one at a time,
	// never through a symlink (a link in a parent, in a directory another
	// user owns, would carry the copies into /etc/kubernetes/manifests),
	// and the copies are written through the handle that was checked.
	parent, err := fsutil.MkdirAllBeneath(string(root), path.Dir(to), 0o700)
	if err != nil {
		return c, fmt.Errorf("%w: %w (no symlink in --to is followed: give the real path)", ErrCollectTarget, err)
	}
	defer parent.Close()
	dir, _, err := fsutil.EnsureDirAt(parent, path.Base(to), 0o700)
	if err != nil {
		return c, fmt.Errorf("%w: %w (no symlink in --to is followed: give the real path)", ErrCollectTarget, err)
	}
	defer dir.Close()
	if err := notManifestsDir(root, dir); err != nil {
		return c, fmt.Errorf("%w: %s %v", ErrCollectTarget, to, err)
	}
	if ents, err := fsutil.ReadDirAt(dir); err != nil {
		return c, fmt.Errorf("%w: %v", ErrCollectTarget, err)
	} else if len(ents) > 0 {
		return c, fmt.Errorf("%w: %s is not empty", ErrCollectTarget, to)
	}
	for _, comp := range Components {
		s := c.From[comp]
		if err := fsutil.WriteFileAtomicAt(dir, s.File, s.data, 0o600); err != nil {
			return c, fmt.Errorf("copy %s/%s: %w", s.Dir, s.File, err)
		}
	}
	return c, nil
}

// notManifestsDir refuses a directory that is the kubelet's manifests
// directory under another name (a bind mount of it).
func notManifestsDir(root paths.Root, dir *os.File) error {
	m, err := fsutil.OpenDirNoFollow(string(root), paths.ManifestsDir)
	if err != nil {
		return nil // no manifests directory to protect
	}
	defer m.Close()
	var a, b unix.Stat_t
	if unix.Fstat(int(dir.Fd()), &a) != nil || unix.Fstat(int(m.Fd()), &b) != nil {
		return errors.New("cannot be compared with the kubelet's manifests directory")
	}
	if a.Dev == b.Dev && a.Ino == b.Ino {
		return errors.New("is the kubelet's manifests directory: collect elsewhere, then copy them in")
	}
	return nil
}
