// Package plan is the decision: observed facts in, one plan out. It does no
// I/O and reads no clock, so every row of the decision table is a table test.
//
// The order of the checks is the contract: the first check that fails names
// the refusal, and every refusal is decided before anything runs.
package plan

import (
	"fmt"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Role is the node's role from the cluster config.
type Role string

// Roles.
const (
	RoleInit         Role = "init"
	RoleControlPlane Role = "controlplane"
	RoleWorker       Role = "worker"
)

// ParseRole accepts exactly the three Kairos roles.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleInit, RoleControlPlane, RoleWorker:
		return r, nil
	}
	return "", fmt.Errorf("unknown role (%s): want init, controlplane or worker", Described(s))
}

// Shown is the role as a log line, a status file or a message may carry
// it: one of the three roles, or empty, as is; anything else described by
// its length only (an unknown role may be the cluster token pasted one
// line off, and a words-and-dashes passphrase looks like any other word).
func (r Role) Shown() string {
	switch r {
	case "", RoleInit, RoleControlPlane, RoleWorker:
		return string(r)
	}
	return Described(string(r))
}

// ShownPin is the pin as a log line, a status file or a message may carry
// it: an exact version (or nothing) as is, anything else described.
func ShownPin(s string) string {
	if s == "" {
		return s
	}
	if _, err := version.Parse(s); err != nil {
		return Described(s)
	}
	return s
}

// Described names a value that failed validation without quoting it.
func Described(s string) string {
	return fmt.Sprintf("<a value of %d characters, not shown>", len(s))
}

// ControlPlane reports whether r runs a control plane (init counts once the node is a member).
func (r Role) ControlPlane() bool { return r == RoleInit || r == RoleControlPlane }

// Verdict is the plan's summary.
type Verdict string

// Verdicts.
const (
	VerdictAct    Verdict = "act"
	VerdictNone   Verdict = "none"
	VerdictRefuse Verdict = "refuse"
)

// Action is one step of a plan, in the order it runs.
type Action string

// Actions.
const (
	ActionInit                  Action = "init"
	ActionJoin                  Action = "join"
	ActionRepairKubelet         Action = "repair-kubelet"
	ActionWaitForClusterUpgrade Action = "wait-for-cluster-upgrade"
	ActionEtcdSnapshot          Action = "etcd-snapshot"
	ActionUpgradeApply          Action = "upgrade-apply"
	ActionUpgradeNode           Action = "upgrade-node"
	ActionRestartKubelet        Action = "restart-kubelet"
	ActionVerify                Action = "verify"
	// ActionRenewCertificates runs kubeadm certs renew all on a converged
	// control plane whose soonest leaf certificate is within
	// certificates.renewBefore; ActionRestartControlPlane then restarts its
	// static pods so they load the renewed certificates.
	ActionRenewCertificates   Action = "renew-certificates"
	ActionRestartControlPlane Action = "restart-control-plane"
)

// Code names a refusal.
type Code string

// Refusal codes.
const (
	InvalidPin            Code = "InvalidPin"
	BundledVersionUnknown Code = "BundledVersionUnknown"
	BundleOutOfWindow     Code = "BundleOutOfWindow"
	InvalidRole           Code = "InvalidRole"
	PinNewerThanImage     Code = "PinNewerThanImage"
	PinImageMismatch      Code = "PinImageMismatch"
	NodeVersionUnknown    Code = "NodeVersionUnknown"
	Downgrade             Code = "Downgrade"
	MajorChange           Code = "MajorChange"
	OutOfWindow           Code = "OutOfWindow"
	SkipLevel             Code = "SkipLevel"
	PinBehindCluster      Code = "PinBehindCluster"
)

// Status reasons carried by a refusal.
const (
	ReasonUpgradeRefused   = "UpgradeRefused"
	ReasonBootstrapRefused = "BootstrapRefused"
)

// Facts are the observed inputs. A zero Version means "unknown".
type Facts struct {
	Member bool
	Role   Role
	Pin    string // raw clusterConfiguration.kubernetesVersion, validated here
	// ConfigError is why the pin could not be read at all (no cluster file,
	// invalid YAML): it is refused as InvalidPin with this message.
	ConfigError string
	Bundled     version.Version
	Node        version.Version
	Cluster     version.Version
	// Verified is the last version this node was verified at (the
	// provider's persistent record, written only after a verify passed or
	// a bootstrap completed); zero when there is no record.
	Verified version.Version
	// Certificates is what the certificate renewal is decided on (zero:
	// renewal off or nothing read).
	Certificates Certificates
}

// Certificates are the facts of the opt-in certificate renewal, read on a
// control plane member whose providerConfig sets certificates.renewBefore.
type Certificates struct {
	// RenewBefore is providerConfig's certificates.renewBefore; 0 is off.
	RenewBefore time.Duration
	// Soonest is kubeadm's name of the leaf certificate (never an
	// authority) that expires first; "" when none was read.
	Soonest string
	// Left is how long that certificate had left when it was read
	// (negative once expired).
	Left time.Duration
}

// RenewalDue reports whether the soonest leaf expires within RenewBefore.
func (c Certificates) RenewalDue() bool {
	return c.RenewBefore > 0 && c.Soonest != "" && c.Left < c.RenewBefore
}

// Shown are Facts as printed: the role and the pin as ShownPin and
// Role.Shown give them (an invalid value described, never quoted), each
// version, or "unknown". plan -o json and preflight -o json print them
// under these names, documented in docs/reference.md.
type Shown struct {
	Member   bool   `json:"member"`
	Role     string `json:"role"`
	Pin      string `json:"pin"`
	Bundled  string `json:"bundled"`
	Node     string `json:"node"`
	Cluster  string `json:"cluster"`
	Verified string `json:"verified"`
}

// Shown is f as printed.
func (f Facts) Shown() Shown {
	v := func(v version.Version) string {
		if v.IsZero() {
			return "unknown"
		}
		return v.String()
	}
	return Shown{Member: f.Member, Role: f.Role.Shown(), Pin: ShownPin(f.Pin), Bundled: v(f.Bundled), Node: v(f.Node),
		Cluster: v(f.Cluster), Verified: v(f.Verified)}
}

// Plan is the decision.
type Plan struct {
	Verdict  Verdict  `json:"verdict"`
	Actions  []Action `json:"actions"`
	Refusal  Code     `json:"refusal"`
	Reason   string   `json:"reason"`
	Message  string   `json:"message"`
	Warnings []string `json:"warnings,omitempty"`
	// Redecide is set when the actions only prepare the ground (the kubelet
	// repair): the executor observes again and decides again before acting.
	Redecide bool `json:"redecide,omitempty"`
	// Pin is the parsed pin when it was valid.
	Pin version.Version `json:"-"`
}

// Refused reports whether the plan is a refusal.
func (p Plan) Refused() bool { return p.Verdict == VerdictRefuse }

// Has reports whether the plan contains action a.
func (p Plan) Has(a Action) bool {
	for _, x := range p.Actions {
		if x == a {
			return true
		}
	}
	return false
}

// Decide is the decision table. w is the supported window.
func Decide(w version.Window, f Facts) Plan {
	reason := ReasonUpgradeRefused
	if !f.Member {
		reason = ReasonBootstrapRefused
	}
	refuse := func(c Code, format string, a ...any) Plan {
		return Plan{Verdict: VerdictRefuse, Actions: []Action{}, Refusal: c, Reason: reason, Message: fmt.Sprintf(format, a...)}
	}

	// 1. The pin and the image must make sense on their own.
	if f.ConfigError != "" {
		return refuse(InvalidPin, "the pin cannot be read: %s", f.ConfigError)
	}
	p, err := version.Parse(f.Pin)
	if f.Pin == "" {
		return refuse(InvalidPin, "clusterConfiguration.kubernetesVersion is not set: pin an exact version such as v%d.%d.0", lastOf(w).Major, lastOf(w).Minor)
	}
	if err != nil {
		return refuse(InvalidPin, "clusterConfiguration.kubernetesVersion (%s) is not an exact vMAJOR.MINOR.PATCH release", Described(f.Pin))
	}
	b := f.Bundled
	if b.IsZero() {
		return refuse(BundledVersionUnknown, "the version of the kubeadm bundled in this image is unknown (no bundle manifest and no answer from kubeadm version): pin %s", p)
	}
	if !w.Contains(b.MinorOf()) {
		return refuse(BundleOutOfWindow, "this image bundles kubeadm %s, outside the supported window %s", b, w)
	}

	// 2. Not a member yet: bootstrap at exactly the image's version.
	if !f.Member {
		if p.Compare(b) > 0 {
			return refuse(PinNewerThanImage, "pin %s is newer than the kubeadm %s this image bundles: boot the image for %s", p, b, p.MinorOf())
		}
		if p.Compare(b) < 0 {
			return refuse(PinImageMismatch, "pin %s does not match the kubeadm %s this image bundles: a new node bootstraps at exactly the image's version", p, b)
		}
		switch f.Role {
		case RoleInit:
			return Plan{Verdict: VerdictAct, Actions: []Action{ActionInit}, Pin: p,
				Message: fmt.Sprintf("initialise a new cluster at %s", p)}
		case RoleControlPlane, RoleWorker:
			return Plan{Verdict: VerdictAct, Actions: []Action{ActionJoin}, Pin: p,
				Message: fmt.Sprintf("join the cluster as %s at %s", f.Role, p)}
		}
		return refuse(InvalidRole, "role (%s) is not init, controlplane or worker (pin %s, image %s)", f.Role.Shown(), p, b)
	}

	n := f.Node
	if n.IsZero() {
		return refuse(NodeVersionUnknown, "this node is a cluster member but its version cannot be read (pin %s, image %s): nothing is changed on doubt", p, b)
	}
	c := f.Cluster
	cp := f.Role.ControlPlane()

	// A newer pin than the image ships is a hard error, also for a node
	// already at the pin: that is an OS rollback to the other, older slot,
	// whose kubeadm cannot manage what the cluster already runs.
	if p.Compare(b) > 0 {
		if p == n {
			return refuse(PinNewerThanImage, "this node already runs the pin %s but the image bundles kubeadm %s: an OS rollback to an older image? "+
				"Nothing runs: boot the image for %s again, or, to go back to %s, restore an etcd snapshot and set the pin to %s (an OS rollback alone does not roll the cluster back)",
				p, b, p.MinorOf(), b.MinorOf(), b)
		}
		return refuse(PinNewerThanImage, "pin %s is newer than the kubeadm %s this image bundles: boot the image for %s (node at %s)", p, b, p.MinorOf(), n)
	}

	// 3. Converged: a newer image with the old pin is deliberately a no-op.
	// One exception: a control plane whose manifests already moved to the pin
	// while the cluster still reads older is an upgrade apply that was
	// interrupted (kubeadm records the cluster version last): resume it.
	if p == n && cp && !c.IsZero() && c.Less(p) && p == b && p.Major == c.Major && p.Minor <= c.Minor+1 {
		return Plan{Verdict: VerdictAct, Actions: []Action{ActionEtcdSnapshot, ActionUpgradeApply, ActionRestartKubelet, ActionVerify}, Pin: p,
			Message: fmt.Sprintf("this control plane's manifests are at %s but the cluster still reads %s: resume the interrupted kubeadm upgrade apply", p, c)}
	}
	// At the pin, but the upgrade to it never reached its verification (a
	// crash between kubeadm and the kubelet restart leaves the manifests at
	// the pin): finish it, restart the kubelet and verify.
	if p == n && !f.Verified.IsZero() && f.Verified.Less(p) && p == b {
		if cp && c.IsZero() {
			// Finishing and resuming an interrupted apply look alike until
			// the cluster's version is known: never finish on doubt.
			return Plan{Verdict: VerdictAct, Actions: []Action{ActionRepairKubelet}, Redecide: true, Pin: p,
				Message: fmt.Sprintf("this control plane is at %s but was last verified at %s and the cluster version is unknown: repair the kubelet, then decide again", p, f.Verified)}
		}
		return Plan{Verdict: VerdictAct, Actions: []Action{ActionRestartKubelet, ActionVerify}, Pin: p,
			Message: fmt.Sprintf("this node is at %s but was last verified at %s: the upgrade was interrupted before its kubelet restart and verification; finish them", p, f.Verified)}
	}
	if p == n {
		pl := Plan{Verdict: VerdictNone, Actions: []Action{}, Pin: p,
			Message: fmt.Sprintf("converged: node at %s matches pin %s", n, p)}
		if b.MinorOf() != n.MinorOf() && n.Less(b) {
			pl.Warnings = append(pl.Warnings, fmt.Sprintf("the image bundles kubelet %s, a newer minor than this node's %s: the kubelet on disk is newer than the cluster (skew risk); bump the pin to %s to upgrade or boot the %s image", b, n, b, n.MinorOf()))
		}
		if !c.IsZero() && n.Less(c) {
			pl.Warnings = append(pl.Warnings, fmt.Sprintf("the cluster is at %s, ahead of this node's %s: bump the pin and boot the matching image to follow", c, n))
		}
		// Only a control plane otherwise converged renews: an upgrade
		// renews the certificates itself, and a refusal changes nothing.
		if cp && f.Certificates.RenewalDue() {
			pl.Verdict = VerdictAct
			pl.Actions = []Action{ActionRenewCertificates, ActionRestartControlPlane}
			pl.Message = fmt.Sprintf("converged at %s, but the certificate %s %s, within certificates.renewBefore %s: renew kubeadm's certificates and restart the control-plane static pods",
				n, f.Certificates.Soonest, shownLeft(f.Certificates.Left), f.Certificates.RenewBefore)
		}
		return pl
	}

	// 4. A change is asked for: it must be one supported step to exactly the image.
	if p.Less(n) {
		return refuse(Downgrade, "pin %s is older than this node's %s: downgrades are not supported (image %s)", p, n, b)
	}
	if p.Major != n.Major {
		return refuse(MajorChange, "pin %s changes the major version of this node's %s (image %s)", p, n, b)
	}
	if !w.Contains(p.MinorOf()) {
		return refuse(OutOfWindow, "pin %s is outside the supported window %s (node %s, image %s)", p, w, n, b)
	}
	if p.Minor > n.Minor+1 {
		return refuse(SkipLevel, "pin %s skips a minor from this node's %s: upgrade one minor at a time, through %d.%d (image %s)", p, n, n.Major, n.Minor+1, b)
	}
	if p != b {
		return refuse(PinImageMismatch, "pin %s does not match the kubeadm %s this image bundles: no close-enough upgrades (node %s)", p, b, n)
	}

	// 5. An upgrade is due: N < P == B.
	if c.IsZero() {
		return Plan{Verdict: VerdictAct, Actions: []Action{ActionRepairKubelet}, Redecide: true, Pin: p,
			Message: fmt.Sprintf("upgrade %s -> %s is due but the cluster version is unknown: repair the kubelet, then decide again", n, p)}
	}
	if p.Less(c) {
		return refuse(PinBehindCluster, "pin %s is behind the cluster's %s: bump the pin to the cluster's version (node %s, image %s)", p, c, n, b)
	}
	tail := []Action{ActionRestartKubelet, ActionVerify}
	if cp {
		if p == c {
			return Plan{Verdict: VerdictAct, Actions: append([]Action{ActionUpgradeNode}, tail...), Pin: p,
				Message: fmt.Sprintf("the cluster already runs %s: upgrade this control plane %s -> %s with kubeadm upgrade node", c, n, p)}
		}
		if p.Minor > c.Minor+1 {
			return refuse(SkipLevel, "pin %s skips a minor from the cluster's %s: upgrade one minor at a time (node %s, image %s)", p, c, n, b)
		}
		return Plan{Verdict: VerdictAct, Actions: append([]Action{ActionEtcdSnapshot, ActionUpgradeApply}, tail...), Pin: p,
			Message: fmt.Sprintf("first control plane: upgrade the cluster %s -> %s with kubeadm upgrade apply", c, p)}
	}
	// A worker's kubelet may reach any apiserver: it waits (bounded) until
	// every control plane serves the target, not only until the cluster
	// version (kubeadm-config) flips with the first one.
	if p == c {
		return Plan{Verdict: VerdictAct, Actions: append([]Action{ActionWaitForClusterUpgrade, ActionUpgradeNode}, tail...), Pin: p,
			Message: fmt.Sprintf("upgrade this worker %s -> %s with kubeadm upgrade node, once every control plane serves %s", n, p, p)}
	}
	return Plan{Verdict: VerdictAct, Actions: append([]Action{ActionWaitForClusterUpgrade, ActionUpgradeNode}, tail...), Pin: p,
		Message: fmt.Sprintf("the control planes are at %s: wait, bounded, for every one to serve %s, then upgrade this worker %s -> %s", c, p, n, p)}
}

// shownLeft is a time left as the plan message says it, to the minute.
func shownLeft(d time.Duration) string {
	if d < 0 {
		return "has expired"
	}
	return "expires in " + d.Truncate(time.Minute).String()
}

func lastOf(w version.Window) version.Minor {
	if len(w) == 0 {
		return version.Minor{Major: 1}
	}
	return w[len(w)-1]
}
