// Package publish puts a node's last reconcile pass on its own Node object:
// annotations under one prefix (phase, versions, outcome, refusal, time,
// boot id), the KubernetesUpgrade condition in the Node's status
// (condition.go) and a Kubernetes Event for each refusal, upgrade start,
// finish and failure the pass recorded, so `kubectl describe node`,
// `kubectl wait` and `provider-kubernetes status --cluster` tell the
// rollout's story.
//
// It runs after the pass (provider-kubernetes-publish.service, ordered
// after the reconcile unit), never inside it: the API being down at boot
// (a control plane's own apiserver comes up after the pass) neither fails
// nor delays the pass. The local status document stays the source of
// truth; publishing is best effort and bounded. Nothing secret is in it:
// the status document carries none.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Event is the log line of a publish.
const Event = "node-publish"

// EventClusterAhead is the log line (and ReasonClusterAhead the Node's
// Event) when a converged node runs an older version than the cluster. A
// pass verified at its pin does not read the cluster at boot (nothing it
// decides depends on it): publish, which waits for the API anyway, tells.
const (
	EventClusterAhead  = "cluster-ahead"
	ReasonClusterAhead = "ClusterAhead"
)

// ClusterReadFor bounds how long publish keeps trying to read the cluster
// version once the pass is on the Node (at most half its budget).
const ClusterReadFor = 2 * time.Minute

// Options configure a publish.
type Options struct {
	Root paths.Root
	// Budget bounds the whole publish (the API may come up late at boot).
	Budget time.Duration
	// APIRequest bounds one request.
	APIRequest time.Duration
	Clock      wait.Clock
	Log        *slog.Logger
}

// ErrNothing: there is no pass to publish, or no Node to publish it on.
var ErrNothing = errors.New("nothing to publish")

// Run publishes the last pass's status document on this node's Node. It
// returns ErrNothing (wrapped) when there is no document, or the node is
// not a member.
func Run(ctx context.Context, o Options) error {
	if o.Clock == nil {
		o.Clock = wait.RealClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Budget <= 0 {
		o.Budget = 5 * time.Minute
	}
	if o.APIRequest <= 0 {
		o.APIRequest = 5 * time.Second
	}
	d, err := status.Read(o.Root, paths.StatusFile)
	if errors.Is(err, os.ErrNotExist) {
		o.Log.Info(Event, "outcome", "nothing", "detail", "no status document: no pass ran in this boot")
		return fmt.Errorf("%w: no status document", ErrNothing)
	}
	if err != nil {
		return err
	}
	// The metrics textfile, again after the pass (whatever the API does):
	// the directory the cluster file's providerConfig names, else the default.
	metricsErr := writeMetrics(o.Root, d)
	if !d.Member {
		o.Log.Info(Event, "outcome", "nothing", "detail", "not a cluster member: no Node to publish on")
		return fmt.Errorf("%w: not a member", ErrNothing)
	}
	client, err := kube.Load(o.Root, o.APIRequest, paths.KubeletConf, paths.AdminConf)
	if err != nil {
		o.Log.Error(Event, "outcome", "failed", "error", err.Error())
		return err
	}
	node, err := (&observe.Observer{Root: o.Root}).NodeName(client.NodeName)
	if err != nil {
		o.Log.Error(Event, "outcome", "failed", "error", err.Error())
		return err
	}
	// Events are recorded once per pass: the marker names the last pass
	// whose events are on the Node.
	pass := d.BootID + " " + d.Time
	marker := o.Root.Path(paths.PublishedMarker)
	// aheadDone: the "cluster ahead" warning of this pass is on the Node
	// too, when its events are.
	done, aheadDone := 0, false
	if b, err := fsutil.ReadFileNoFollow(marker, 4<<10); err == nil && strings.TrimSpace(string(b)) == pass {
		done, aheadDone = len(d.Events), true
	}
	start := o.Clock.Now()
	annotations := status.Annotations(d)
	// The cluster's version, when the pass did not read it: for the
	// annotation and the "cluster ahead" warning. Best effort: a failed
	// read is retried for up to ClusterReadFor (a control plane's apiserver
	// just started forbids a node's read of kubeadm-config until its RBAC
	// cache has synced, while the Node authorizer already lets it annotate
	// its own Node), but never fails the publish.
	clusterUntil := start.Add(min(ClusterReadFor, o.Budget/2))
	cluster, clusterErr := version.Version{}, error(nil)
	if c, err := version.Parse(d.ClusterVersion); err == nil {
		cluster = c
	}
	nodeV, nodeErr := version.Parse(d.NodeVersion)
	// condition: the KubernetesUpgrade condition set, once per publish.
	condition := ""
	b := wait.Budget{Total: o.Budget, Interval: 5 * time.Second, PerAttempt: o.APIRequest * time.Duration(5+len(d.Events))}
	err = wait.Poll(ctx, o.Clock, b, "publish the last pass on node "+node, func(ctx context.Context) (bool, error) {
		if cluster.IsZero() {
			if cluster, clusterErr = client.ClusterVersion(ctx); clusterErr == nil {
				annotations[status.AnnotationPrefix+status.KeyClusterVersion] = cluster.String()
			}
		}
		if err := client.Annotate(ctx, node, annotations); err != nil {
			return false, err
		}
		if condition == "" {
			current, err := client.NodeConditions(ctx, node)
			if err != nil {
				return false, err
			}
			c := Condition(d, find(current, ConditionType), o.Clock.Now())
			if err := client.SetNodeCondition(ctx, node, c); err != nil {
				return false, err
			}
			condition = c.Status + "/" + c.Reason
		}
		for done < len(d.Events) {
			ev := d.Events[done]
			at, perr := time.Parse(time.RFC3339, ev.Time)
			if perr != nil {
				at = o.Clock.Now()
			}
			if err := client.NodeEvent(ctx, node, ev.Type, ev.Reason, ev.Message, at); err != nil {
				return false, err
			}
			done++
		}
		if cluster.IsZero() && o.Clock.Now().Before(clusterUntil) {
			// Published; tried again for the cluster version only.
			return false, fmt.Errorf("the pass is on the Node; the cluster version is not read yet: %w", clusterErr)
		}
		if !aheadDone && d.Phase == status.PhaseConverged && nodeErr == nil && !cluster.IsZero() && nodeV.Less(cluster) {
			msg := fmt.Sprintf("the cluster is at %s, ahead of this node's %s: bump the pin and boot the matching image to follow", cluster, nodeV)
			if err := client.NodeEvent(ctx, node, "Warning", ReasonClusterAhead, msg, o.Clock.Now()); err != nil {
				return false, err
			}
			o.Log.Warn(EventClusterAhead, "node", node, "node_version", nodeV.String(), "cluster_version", cluster.String(), "warning", msg)
			aheadDone = true
		}
		return true, nil
	})
	attrs := []any{"outcome", "ok", "node", node, "annotations", len(annotations), "condition", condition, "events", done, "duration", o.Clock.Now().Sub(start).Round(time.Millisecond).String()}
	if clusterErr != nil {
		attrs = append(attrs, "detail", "cluster version not read: "+runner.Sanitize(clusterErr.Error(), 300))
	}
	if metricsErr != nil {
		attrs = append(attrs, "metrics", "not written: "+runner.Sanitize(metricsErr.Error(), 300))
	}
	if err != nil {
		attrs[1] = "failed"
		o.Log.Error(Event, append(attrs, "error", runner.Sanitize(err.Error(), 400))...)
		return err
	}
	// The marker is written under the pass's rules: its lock (which also
	// refuses a /run/provider-kubernetes another user owns). Not written,
	// the next publish records the Events again.
	if unlock, err := reconcile.Lock(o.Root); err == nil {
		_ = fsutil.WriteFileAtomic(marker, []byte(pass+"\n"), 0o644)
		unlock()
	} else {
		attrs = append(attrs, "marker", "not written: "+runner.Sanitize(err.Error(), 300))
	}
	o.Log.Info(Event, attrs...)
	return nil
}

// writeMetrics writes the node_exporter textfile of d (internal/metrics)
// where the cluster file's providerConfig says (unread or invalid: the
// default directory).
func writeMetrics(root paths.Root, d status.Document) error {
	dir := metrics.DefaultDir
	if cfg, err := (&observe.Observer{Root: root}).Config(); err == nil && cfg.Cluster != nil {
		if v, err := metrics.Dir(cfg.Cluster.ProviderConfig); err == nil {
			dir = v
		}
	}
	return metrics.Write(root, dir, d)
}
