// Package staticpods restarts a control plane's static pods the way
// kubeadm documents for a certificate renewal: each manifest is moved out
// of the kubelet's manifest directory, the kubelet stops the pod, the
// manifest is moved back and the kubelet starts it again, now reading the
// renewed certificates. The manifests come back byte-identical (a rename,
// never a rewrite); every wait is bounded; a manifest left parked by a
// killed pass is put back by the next one (RestoreParked) before anything
// looks at the manifests.
package staticpods

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
)

// Components are the static pods kubeadm writes on a control plane (etcd
// only when stacked), by manifest name and container name.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ParkDir is where the manifests wait while their pods stop: on the same
// filesystem as the manifest directory (a rename), outside it (the
// kubelet reads every file there), 0700, removed once they are back.
const ParkDir = paths.KubernetesDir + "/provider-kubernetes-parked"

// KubeletFileCheck is how often the kubelet re-reads its manifest
// directory at least (KubeletConfiguration fileCheckFrequency, 20 s by
// default): a pod is not waited for as stopped before the kubelet has
// certainly seen its manifest gone.
const KubeletFileCheck = 20 * time.Second

// defaultPorts are the ports each component listens on when its manifest
// does not say (kubeadm's defaults).
var defaultPorts = map[string][]int{
	"etcd":                    {2379},
	"kube-apiserver":          {6443},
	"kube-controller-manager": {10257},
	"kube-scheduler":          {10259},
}

// Ports are the TCP ports a component's manifest makes it listen on: the
// apiserver's, controller-manager's and scheduler's --secure-port, etcd's
// --listen-client-urls; kubeadm's default when the flag is absent.
func Ports(component string, manifest []byte) []int {
	flags, err := observe.ManifestFlags(manifest, component)
	if err != nil {
		return defaultPorts[component]
	}
	var out []int
	if component == "etcd" {
		for _, u := range strings.Split(flags["listen-client-urls"], ",") {
			if pu, err := url.Parse(strings.TrimSpace(u)); err == nil {
				if p, err := strconv.Atoi(pu.Port()); err == nil && p > 0 && p < 65536 {
					out = append(out, p)
				}
			}
		}
	} else if p, err := strconv.Atoi(flags["secure-port"]); err == nil && p > 0 && p < 65536 {
		out = append(out, p)
	}
	if len(out) == 0 {
		return defaultPorts[component]
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MaxProcNet bounds one read of /proc/net/tcp or tcp6.
const MaxProcNet = 16 << 20

// Listening are the local TCP ports in LISTEN state (/proc/net/tcp and
// tcp6 under root; a host without IPv6 has no tcp6).
func Listening(root paths.Root) (map[int]bool, error) {
	out := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := fsutil.ReadFileNoFollow(root.Path(f), MaxProcNet)
		if errors.Is(err, os.ErrNotExist) && f == "/proc/net/tcp6" {
			continue
		}
		if err != nil {
			return nil, err
		}
		for p := range ListeningPorts(b) {
			out[p] = true
		}
	}
	return out, nil
}

// ListeningPorts parses /proc/net/tcp{,6}: the local ports of the sockets
// in state 0A (LISTEN).
func ListeningPorts(b []byte) map[int]bool {
	out := map[int]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, port, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(port, 16, 16); err == nil {
			out[int(p)] = true
		}
	}
	return out
}

// Restarter restarts the static pods of this control plane.
type Restarter struct {
	Root  paths.Root
	Clock wait.Clock
	// Ready is one attempt at "the control plane is back": the local
	// apiserver's /readyz answering (with the renewed certificate).
	Ready func(ctx context.Context) error
	// Budget bounds the whole restart (the pass gives budget.localAPI).
	Budget time.Duration
	// Listening is the local TCP ports that listen; nil reads them from
	// /proc/net under Root (Listening). Tests play the kubelet here.
	Listening func() (map[int]bool, error)
}

func (r *Restarter) listening() (map[int]bool, error) {
	if r.Listening != nil {
		return r.Listening()
	}
	return Listening(r.Root)
}

// Restart moves every control-plane manifest present out of the manifest
// directory, waits until the kubelet has stopped their pods (at least one
// file check of the kubelet, then none of their ports listening), moves
// them back and waits until each listens again and Ready passes, all of
// it within Budget. Whatever happens after the
// manifests moved, they are moved back before Restart returns, unless a
// manifest of the same name appeared meanwhile (never overwritten: the
// parked one stays in ParkDir and the error says so). restarted names the
// components whose manifests were moved.
func (r *Restarter) Restart(ctx context.Context) (restarted []string, err error) {
	clk := r.Clock
	if clk == nil {
		clk = wait.RealClock{}
	}
	deadline := clk.Now().Add(r.Budget)
	manifests := r.Root.Path(paths.ManifestsDir)
	ports := map[string][]int{}
	for _, c := range Components {
		b, err := observe.ReadManifest(filepath.Join(manifests, c+".yaml"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		ports[c] = Ports(c, b)
		restarted = append(restarted, c)
	}
	if len(restarted) == 0 {
		return nil, errors.New("no control-plane manifest in " + paths.ManifestsDir)
	}
	pd, err := fsutil.MkdirAllBeneath(r.Root.Path("/"), ParkDir, 0o700)
	if err != nil {
		return nil, fmt.Errorf("park directory: %w", err)
	}
	pd.Close()
	var parked []string
	for _, c := range restarted {
		if err := move(r.Root, paths.ManifestsDir, ParkDir, c+".yaml"); err != nil {
			err = fmt.Errorf("move %s.yaml out of %s: %w", c, paths.ManifestsDir, err)
			return nil, errors.Join(err, r.unpark(parked))
		}
		parked = append(parked, c)
	}
	down := r.waitDown(ctx, clk, deadline, restarted, ports)
	if err := r.unpark(parked); err != nil {
		return restarted, errors.Join(down, err)
	}
	if down != nil {
		return restarted, down
	}
	return restarted, r.waitUp(ctx, clk, deadline, restarted, ports)
}

func (r *Restarter) waitDown(ctx context.Context, clk wait.Clock, deadline time.Time, cs []string, ports map[string][]int) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("wait for the kubelet to stop %s: %w", strings.Join(cs, ", "), ctx.Err())
	case <-clk.After(KubeletFileCheck):
	}
	return wait.Poll(ctx, clk, budget(clk, deadline), "wait for the kubelet to stop "+strings.Join(cs, ", "), func(context.Context) (bool, error) {
		l, err := r.listening()
		if err != nil {
			return false, err
		}
		for _, c := range cs {
			for _, p := range ports[c] {
				if l[p] {
					return false, fmt.Errorf("%s still listens on port %d", c, p)
				}
			}
		}
		return true, nil
	})
}

func (r *Restarter) waitUp(ctx context.Context, clk wait.Clock, deadline time.Time, cs []string, ports map[string][]int) error {
	return wait.Poll(ctx, clk, budget(clk, deadline), "wait for the kubelet to start "+strings.Join(cs, ", ")+" again", func(actx context.Context) (bool, error) {
		l, err := r.listening()
		if err != nil {
			return false, err
		}
		for _, c := range cs {
			for _, p := range ports[c] {
				if !l[p] {
					return false, fmt.Errorf("%s does not listen on port %d yet", c, p)
				}
			}
		}
		if r.Ready != nil {
			if err := r.Ready(actx); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// budget is what is left of the restart's budget, for one wait.Poll (none
// left: Poll fails at once, saying so).
func budget(clk wait.Clock, deadline time.Time) wait.Budget {
	return wait.Budget{Total: deadline.Sub(clk.Now()), Interval: 2 * time.Second, PerAttempt: 5 * time.Second}
}

func (r *Restarter) unpark(cs []string) error {
	var errs []error
	for _, c := range cs {
		if err := move(r.Root, ParkDir, paths.ManifestsDir, c+".yaml"); err != nil {
			errs = append(errs, fmt.Errorf("move %s.yaml back into %s: %w (it is in %s)", c, paths.ManifestsDir, err, ParkDir))
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(r.Root.Path(ParkDir))
	}
	return errors.Join(errs...)
}

// move renames name from the host directory from to the host directory to
// (both under root), never replacing a file there (RENAME_NOREPLACE), and
// syncs both directories. Each directory is opened beneath root without
// following a symlink in any component, and the rename is made between
// those handles: a link planted in a path cannot carry a manifest
// elsewhere.
func move(root paths.Root, from, to, name string) error {
	fd, err := fsutil.OpenDirNoFollow(root.Path("/"), from)
	if err != nil {
		return err
	}
	defer fd.Close()
	td, err := fsutil.OpenDirNoFollow(root.Path("/"), to)
	if err != nil {
		return err
	}
	defer td.Close()
	if err := unix.Renameat2(int(fd.Fd()), name, int(td.Fd()), name, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: from + "/" + name, New: to + "/" + name, Err: err}
	}
	_ = td.Sync()
	_ = fd.Sync()
	return nil
}

// RestoreParked moves back every manifest a killed pass left in ParkDir,
// never over one that is in the manifest directory again. restored are
// the ones moved back, kept the ones left (with why in err).
func RestoreParked(root paths.Root) (restored []string, err error) {
	ents, rerr := fsutil.ReadDir(root.Path(ParkDir))
	if errors.Is(rerr, os.ErrNotExist) {
		return nil, nil
	}
	if rerr != nil {
		return nil, rerr
	}
	var cs []string
	for _, e := range ents {
		c, ok := strings.CutSuffix(e.Name(), ".yaml")
		if !ok || !slices.Contains(Components, c) || !e.Type().IsRegular() {
			continue
		}
		cs = append(cs, c)
	}
	var errs []error
	for _, c := range cs {
		if err := move(root, ParkDir, paths.ManifestsDir, c+".yaml"); err != nil {
			errs = append(errs, fmt.Errorf("move %s.yaml back into %s: %w (it stays in %s)", c, paths.ManifestsDir, err, ParkDir))
			continue
		}
		restored = append(restored, c)
	}
	if len(errs) == 0 {
		_ = os.Remove(root.Path(ParkDir))
	}
	return restored, errors.Join(errs...)
}
