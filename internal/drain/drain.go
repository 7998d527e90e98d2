// Package drain empties a Node of its pods before a reboot, the way
// `kubectl drain` does but bounded: cordon the Node, evict each pod
// through the Eviction API (so every PodDisruptionBudget is honoured),
// skip what must stay (DaemonSet pods, the kubelet's mirror pods), retry
// what a budget blocks until the total budget ends, then name the budgets
// that block and the pods still there.
//
// Decide is the decision over the pods the API lists (pure); Run acts on
// it, listing and deciding again each round. Who may drain is the API's
// answer: a node's own kubelet.conf may drain that node (the Node
// authorizer and the NodeRestriction admission allow a node to cordon its
// own Node, list the pods bound to it and evict them), not another one.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
)

// Why a pod is not evicted.
const (
	SkipDaemonSet = "DaemonSet"  // its controller ignores the cordon and would put it back
	SkipMirror    = "mirror pod" // the kubelet's static pod: it stays with the node
	SkipExcluded  = "excluded"   // named with --exclude-pod (the pod running the drain)
)

// Skipped is a pod left in place, and why.
type Skipped struct {
	Pod kube.NodePod
	Why string
}

// Plan is the decision over a Node's pods.
type Plan struct {
	Evict []kube.NodePod // to evict now
	// Terminating pods are already on their way out: waited for.
	Terminating []kube.NodePod
	Skipped     []Skipped
	// Unmanaged pods have no controller to create them again elsewhere:
	// evicted, they are gone. Without Force the drain refuses them.
	Unmanaged []kube.NodePod
}

// Options of a decision.
type Options struct {
	// Force evicts pods that no controller manages (as kubectl drain
	// --force): they are not created again elsewhere.
	Force bool
	// Exclude names pods ("namespace/name") left in place: the pod the
	// drain itself runs in, when it runs in one on this node.
	Exclude map[string]bool
}

// Decide sorts a Node's pods: skipped (excluded, mirror, DaemonSet),
// terminating (waited for), to evict, and without a controller (evicted
// only with Force). A finished pod (Succeeded, Failed) is evicted
// whatever owns it: the Eviction API deletes it without consulting a
// budget, and nothing is lost.
func Decide(pods []kube.NodePod, o Options) Plan {
	var p Plan
	for _, pod := range pods {
		finished := pod.Phase == "Succeeded" || pod.Phase == "Failed"
		switch {
		case o.Exclude[pod.String()]:
			p.Skipped = append(p.Skipped, Skipped{pod, SkipExcluded})
		case pod.Mirror:
			p.Skipped = append(p.Skipped, Skipped{pod, SkipMirror})
		case pod.Controller == "DaemonSet":
			p.Skipped = append(p.Skipped, Skipped{pod, SkipDaemonSet})
		case pod.Terminating:
			p.Terminating = append(p.Terminating, pod)
		case pod.Controller == "" && !finished && !o.Force:
			p.Unmanaged = append(p.Unmanaged, pod)
		default:
			p.Evict = append(p.Evict, pod)
		}
	}
	return p
}

// Left is what keeps the Node from being drained: pods to evict,
// terminating or unmanaged.
func (p Plan) Left() []kube.NodePod {
	out := append(append(append([]kube.NodePod(nil), p.Evict...), p.Terminating...), p.Unmanaged...)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// API is what a drain asks of the apiserver (internal/kube's Client).
type API interface {
	PodsOn(ctx context.Context, node string) ([]kube.NodePod, error)
	Cordon(ctx context.Context, node string, unschedulable bool) (bool, error)
	Evict(ctx context.Context, p kube.NodePod) error
	DisruptionBudgets(ctx context.Context, namespace string) ([]kube.DisruptionBudget, error)
}

// Config of a drain.
type Config struct {
	API  API
	Node string
	Options
	// Budget bounds the whole drain; Interval is the pause between rounds
	// (at most 2s: wait.Poll's bound).
	Budget, Interval time.Duration
	Clock            wait.Clock
	Log              *slog.Logger
}

// Result is what a drain did.
type Result struct {
	Evicted []string // namespace/name, each evicted pod
	Skipped []Skipped
	// Left: the pods still on the Node when the drain stopped, each with
	// what keeps it there (the last eviction answer, the budget's cause).
	Left map[string]string
	// Blocking names the PodDisruptionBudgets that cover a pod left, with
	// their numbers, when the credentials may list them; else the
	// apiserver's own words for the budget that refused the eviction.
	Blocking []string
	// Uncordoned: the drain failed and made the Node schedulable again
	// (it was schedulable before the drain).
	Uncordoned bool
}

// LeftPods are the pods left, sorted.
func (r Result) LeftPods() []string { return sortedKeys(r.Left) }

// Errors a drain returns (wrapped, with the detail).
var (
	// ErrRefused: pods no controller manages, and no Force; nothing was
	// changed (the Node is not cordoned).
	ErrRefused = errors.New("refused: pods without a controller would be lost")
	// ErrNotDrained: the budget ended with pods still on the Node.
	ErrNotDrained = errors.New("pods still on the node when the budget ended")
	// ErrForbidden: the credentials may not do a step; retrying cannot help.
	ErrForbidden = errors.New("the credentials may not do this")
)

// Event is the log line of a drain.
const Event = "drain"

// maxRound bounds one round (a list and the round's evictions, each
// request bounded by the client's own timeout).
const maxRound = time.Minute

// Run drains the Node, every step within the budget: each round lists its
// pods and decides (Decide) again; the first round refuses, unchanged,
// when Decide finds unmanaged pods, else cordons the Node; every round
// evicts those to evict and waits for the terminating ones, until nothing
// but skipped pods is left or the budget ends. A pod a
// PodDisruptionBudget protects is retried every round (the apiserver
// answers 429 until the budget allows a disruption). An error the
// credentials cause (403) ends the drain at once; any other is retried.
// When the drain fails after cordoning a Node that was schedulable, it
// makes it schedulable again: a drain that did not finish leaves no node
// out of service.
func Run(ctx context.Context, c Config) (Result, error) {
	if c.Clock == nil {
		c.Clock = wait.RealClock{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	start := c.Clock.Now()
	res := Result{Left: map[string]string{}}
	var (
		current  []kube.NodePod
		cordoned bool // this drain made sure the Node is unschedulable
		// was: the Node was unschedulable before, as the first cordon that
		// answered read it (a cordon applied whose answer was lost reads as
		// cordoned before: the node is then left cordoned, never
		// uncordoned behind a person's back).
		was     bool
		evicted = map[string]bool{} // by uid: asked and accepted, waited for
		// causes: the budgets' causes the last refusal of each pod gave.
		causes = map[string][]string{}
		fatal  error
	)
	b := wait.Budget{Total: c.Budget, Interval: c.Interval, PerAttempt: min(c.Budget, maxRound)}
	err := wait.Poll(ctx, c.Clock, b, "drain node "+c.Node, func(ctx context.Context) (bool, error) {
		pods, err := c.API.PodsOn(ctx, c.Node)
		if err != nil {
			if apierrors.IsForbidden(err) {
				fatal = failure(err)
				return true, nil
			}
			return false, err
		}
		current = pods
		pl := Decide(pods, c.Options)
		res.Skipped = pl.Skipped
		left := map[string]string{}
		if !cordoned {
			if len(pl.Unmanaged) > 0 {
				for _, p := range pl.Unmanaged {
					left[p.String()] = "no controller: evicted, it would not be created again (--force evicts it)"
				}
				res.Left = left
				fatal = fmt.Errorf("%w: %s; nothing changed", ErrRefused, names(pl.Unmanaged))
				return true, nil
			}
			w, err := c.API.Cordon(ctx, c.Node, true)
			if err != nil {
				if apierrors.IsForbidden(err) {
					fatal = failure(err)
					return true, nil
				}
				return false, err
			}
			was, cordoned = w, true
		}
		var last error
		for _, p := range pl.Terminating {
			left[p.String()] = "terminating"
		}
		for _, p := range pl.Unmanaged {
			left[p.String()] = "no controller (came after the drain started): --force evicts it"
			last = fmt.Errorf("pod %s has no controller", p)
		}
		for _, p := range pl.Evict {
			if evicted[p.UID] {
				left[p.String()] = "evicted, not gone yet"
				continue
			}
			err := c.API.Evict(ctx, p)
			switch {
			case err == nil:
				evicted[p.UID] = true
				res.Evicted = append(res.Evicted, p.String())
				left[p.String()] = "evicted, not gone yet"
				continue
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				continue // gone, or replaced under its name: the next list tells
			case apierrors.IsForbidden(err) && len(kube.DisruptionBudgetCauses(err)) == 0:
				fatal = failure(fmt.Errorf("evict pod %s: %w", p, err))
				return true, nil
			}
			causes[p.String()] = kube.DisruptionBudgetCauses(err)
			left[p.String()] = describe(err)
			last = fmt.Errorf("evict pod %s: %w", p, err)
		}
		if ctx.Err() != nil {
			// The round was cut: the last whole round's account stands.
			return false, ctx.Err()
		}
		res.Left = left
		if len(left) == 0 {
			return true, nil
		}
		if last == nil {
			last = fmt.Errorf("%d pods not gone yet: %s", len(left), strings.Join(sortedKeys(left), ", "))
		}
		return false, last
	})
	if fatal != nil {
		err = fatal
	}
	if err == nil {
		return res, c.done(res, start, nil)
	}
	if errors.Is(err, wait.ErrBudgetExhausted) && len(res.Left) > 0 {
		res.Blocking = c.blocking(ctx, current, res.Left, causes)
		err = fmt.Errorf("%w: %s: %v", ErrNotDrained, strings.Join(sortedKeys(res.Left), ", "), err)
	}
	if cordoned && !was {
		// Its own bound: the drain's may be spent.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, uerr := c.API.Cordon(uctx, c.Node, false)
		cancel()
		if uerr != nil {
			err = fmt.Errorf("%w; and the node stays cordoned: %v", err, uerr)
		} else {
			res.Uncordoned = true
		}
	}
	return res, c.done(res, start, err)
}

// failure marks a refusal of the credentials.
func failure(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: %v", ErrForbidden, err)
	}
	return err
}

// describe is an eviction's refusal as the result shows it: the
// budget's cause when the apiserver gave one.
func describe(err error) string {
	if causes := kube.DisruptionBudgetCauses(err); len(causes) > 0 {
		return "blocked: " + strings.Join(causes, "; ")
	}
	if apierrors.IsTooManyRequests(err) {
		return "blocked: " + err.Error()
	}
	return err.Error()
}

// blocking names the PodDisruptionBudgets covering the pods left: read
// from the API when the credentials may list them (a node's own may not),
// else the apiserver's causes the evictions were refused with, which name
// the budget too.
func (c Config) blocking(ctx context.Context, pods []kube.NodePod, left map[string]string, causes map[string][]string) []string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	byName := map[string]kube.NodePod{}
	for _, p := range pods {
		byName[p.String()] = p
	}
	budgets := map[string][]kube.DisruptionBudget{}
	unreadable := map[string]error{}
	seen := map[string]bool{}
	var out []string
	add := func(key, line string) {
		if !seen[key] {
			seen[key] = true
			out = append(out, line)
		}
	}
	for _, name := range sortedKeys(left) {
		p, ok := byName[name]
		if !ok {
			continue
		}
		list, read := budgets[p.Namespace]
		if !read && unreadable[p.Namespace] == nil {
			var err error
			if list, err = c.API.DisruptionBudgets(ctx, p.Namespace); err != nil {
				unreadable[p.Namespace] = err
			}
			budgets[p.Namespace] = list
		}
		if err := unreadable[p.Namespace]; err != nil {
			for _, cause := range causes[name] {
				add(cause, cause+" (the apiserver's answer to the eviction of "+name+"; the budgets are not readable with these credentials: "+
					runner.Sanitize(err.Error(), 200)+")")
			}
			continue
		}
		for _, b := range list {
			if key := b.Namespace + "/" + b.Name; b.Selects(p.Labels) {
				add(key, fmt.Sprintf("%s (minAvailable %s, maxUnavailable %s: %d of %d desired healthy, %d disruptions allowed)",
					key, orDash(b.MinAvailable), orDash(b.MaxUnavailable), b.CurrentHealthy, b.DesiredHealthy, b.DisruptionsAllowed))
			}
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// done logs the drain's line and returns err.
func (c Config) done(res Result, start time.Time, err error) error {
	attrs := []any{"outcome", "drained", "node", c.Node, "evicted", len(res.Evicted), "skipped", len(res.Skipped), "left", len(res.Left),
		"duration", c.Clock.Now().Sub(start).Round(time.Millisecond).String()}
	switch {
	case err == nil:
		c.Log.Info(Event, attrs...)
		return nil
	case errors.Is(err, ErrRefused):
		attrs[1] = "refused"
	default:
		attrs[1] = "failed"
	}
	if len(res.Blocking) > 0 {
		attrs = append(attrs, "blocking", status.Printable(runner.Sanitize(strings.Join(res.Blocking, "; "), 1000)))
	}
	if res.Uncordoned {
		attrs = append(attrs, "uncordoned", true)
	}
	c.Log.Error(Event, append(attrs, "error", status.Printable(runner.Sanitize(err.Error(), 1000)))...)
	return err
}

func names(pods []kube.NodePod) string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.String()
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
