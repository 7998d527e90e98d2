package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Overrides are facts given instead of observed (the plan preview's flags).
// A nil field is observed.
type Overrides struct {
	Pin     *string
	Bundled *version.Version // zero means unknown
	Node    *version.Version
	Cluster *version.Version // zero means unknown
	Role    *plan.Role
	Member  *bool
	// Verified is the last verified version (zero: no record). Not given
	// with every other fact given, it is unknown rather than read.
	Verified *version.Version
	// Config is the cluster section as read elsewhere (preflight: the one
	// the next boot will use), in place of the cluster file; its pin and
	// role are facts as the cluster file's are.
	Config *ConfigRead
}

// ConfigRead is a cluster section read, or why it could not be.
type ConfigRead struct {
	Config observe.Config
	Err    error
}

// Complete reports whether every fact is given, so nothing is read from the node.
func (o Overrides) Complete() bool {
	if o.Pin == nil || o.Bundled == nil || o.Role == nil || o.Member == nil {
		return false
	}
	return !*o.Member || (o.Node != nil && o.Cluster != nil)
}

// Observation is the facts plus what was learned getting them.
type Observation struct {
	Facts  plan.Facts
	Config observe.Config // zero when the config was not read
	// ConfigErr is why the cluster file could not be read or used (nil
	// when it was, or when the pin and role were given).
	ConfigErr    error
	ControlPlane bool
	Client       *kube.Client
	Notes        []string // why a fact is unknown, where it came from
	// Budgets are the pass's budgets (defaults with providerConfig overrides).
	Budgets Budgets
}

// Gather observes the facts not given in ov. clusterBudget bounds the
// cluster-version read when an upgrade may be due; a converged node tries
// once, briefly, only to be able to warn.
func Gather(ctx context.Context, o *observe.Observer, ov Overrides, clusterBudget wait.Budget) Observation {
	var obs Observation
	f := &obs.Facts
	note := func(s string) { obs.Notes = append(obs.Notes, s) }

	if ov.Pin == nil || ov.Role == nil {
		var cfg observe.Config
		var err error
		if ov.Config != nil {
			cfg, err = ov.Config.Config, ov.Config.Err
		} else {
			cfg, err = o.Config()
		}
		if err != nil {
			if ov.Pin == nil {
				f.ConfigError = err.Error()
			}
			obs.ConfigErr = err
			note(err.Error())
		}
		obs.Config = cfg
		f.Pin, f.Role = cfg.Pin, cfg.Role
	}
	if ov.Pin != nil {
		f.Pin = *ov.Pin
	}

	if ov.Bundled != nil {
		f.Bundled = *ov.Bundled
	} else if v, src, err := o.Bundled(ctx); err != nil {
		note("bundled version unknown: " + err.Error())
	} else {
		f.Bundled = v
		note("bundled version from " + src)
	}

	member, cp := false, false
	if ov.Member == nil || (ov.Role == nil) {
		m, c, err := o.Membership()
		if err != nil {
			note("membership: " + err.Error())
		}
		member, cp = m, c
	}
	if ov.Member != nil {
		member = *ov.Member
	}
	f.Member = member
	switch {
	case ov.Role != nil:
		f.Role = *ov.Role
		cp = f.Role.ControlPlane()
	case member && cp && !f.Role.ControlPlane():
		note("this node runs a control plane whatever the cluster file's role says")
		f.Role = plan.RoleControlPlane
	case member && !cp && f.Role.ControlPlane():
		note("the cluster file says " + string(f.Role) + " but this member has no kube-apiserver manifest: treated as a worker")
		f.Role = plan.RoleWorker
	}
	obs.ControlPlane = member && cp
	if !member {
		return obs
	}
	if cp {
		gatherCertificates(o, &obs)
	}

	needClient := ov.Cluster == nil || (ov.Node == nil && !cp)
	if needClient {
		c, err := o.Client()
		if err != nil {
			note("api client: " + err.Error())
		}
		obs.Client = c
	}

	if ov.Node != nil {
		f.Node = *ov.Node
	} else if cp {
		v, err := o.ControlPlaneVersion()
		if err != nil {
			note("control plane version: " + err.Error())
		}
		f.Node = v
	} else {
		v, src, err := o.WorkerVersion(ctx, obs.Client)
		if err != nil {
			note(err.Error())
		} else {
			note("node version from " + src)
		}
		f.Node = v
	}

	if ov.Verified != nil {
		f.Verified = *ov.Verified
	} else if ov.Complete() {
		// Every fact given: nothing is read from the node.
	} else if v, err := o.VerifiedVersion(); err != nil {
		note("verified version: " + err.Error())
	} else {
		f.Verified = v
	}

	if ov.Cluster != nil {
		f.Cluster = *ov.Cluster
		return obs
	}
	// A refusal decided without the cluster version is the one decided
	// with it (plan's refusals that need it come after those that do not):
	// refuse now rather than wait on an API that may be down by design (a
	// control plane booted back into an older image after a restore).
	if plan.Decide(images.Window(), *f).Refused() {
		note("cluster version not read: the refusal does not depend on it")
		return obs
	}
	pin, perr := version.Parse(f.Pin)
	if perr == nil && pin == f.Node && f.Verified == pin {
		// Converged and verified at the pin: no plan reads the cluster
		// version (an interrupted apply would have left the record older),
		// it would only feed the "cluster ahead" warning. Nothing is read
		// on the boot's critical path; the publish step, which waits for
		// the API anyway, compares the node with the cluster.
		note("cluster version not read: this node was verified at the pin (the publish step compares it with the cluster)")
		return obs
	}
	if perr == nil && pin == f.Node && (f.Verified.IsZero() || !f.Verified.Less(pin)) {
		// At the pin with no record of its verification (a node
		// bootstrapped by an earlier release): the cluster version tells a
		// converged node from an interrupted apply. One attempt, never a
		// wait: at boot a control plane's own apiserver is not up yet.
		v, err := o.ClusterVersionOnce(ctx, obs.Client)
		if err != nil {
			note("cluster version not read on a converged boot (one attempt): " + err.Error())
		}
		f.Cluster = v
		return obs
	}
	v, err := o.ClusterVersion(ctx, obs.Client, clusterBudget)
	if err != nil {
		note("cluster version unknown: " + err.Error())
	}
	f.Cluster = v
	return obs
}

// ConfigBudgets is what every pass does with the cluster section before it
// decides, shared with plan so both say the same: base with the
// providerConfig's budget overrides, or the section's providerConfig
// problem (a failure, ConfigInvalid, never a refusal: a nested map where
// Kairos's schema has flat strings, an unknown key, a bad budget or
// metrics directory).
func ConfigBudgets(obs Observation, base Budgets) (Budgets, error) {
	if errors.Is(obs.ConfigErr, clusterconfig.ErrProviderConfig) {
		return base, obs.ConfigErr
	}
	if obs.Config.Cluster == nil {
		return base, nil
	}
	return base.WithOverrides(obs.Config.Cluster.ProviderConfig)
}

// gatherCertificates reads the facts of the certificate renewal on a
// control plane whose providerConfig turns it on (certs.RenewBeforeKey):
// the leaf that expires first and how long it has left. Nothing is read
// when renewal is off (a converged pass costs what it did); a value
// providerConfig refuses is the pass's refusal, not decided here.
func gatherCertificates(o *observe.Observer, obs *Observation) {
	if obs.Config.Cluster == nil {
		return
	}
	before, err := certs.RenewBefore(obs.Config.Cluster.ProviderConfig)
	if err != nil || before == 0 {
		return
	}
	now := time.Now
	if o.Clock != nil {
		now = o.Clock.Now
	}
	read, errs := certs.Read(o.Root)
	c, ok := certs.Soonest(read, false)
	f := &obs.Facts.Certificates
	f.RenewBefore = before
	if len(errs) > 0 {
		obs.Notes = append(obs.Notes, fmt.Sprintf("certificates: %d not read (%s)", len(errs), errs[0].Error()))
	}
	if !ok {
		obs.Notes = append(obs.Notes, "certificates: no leaf certificate read: no renewal is decided")
		return
	}
	f.Soonest, f.Left = c.Name, c.NotAfter.Sub(now())
}
