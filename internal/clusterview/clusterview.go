// Package clusterview is the rollout as one table: every node's versions
// and the outcome of its last pass (from the annotations each node
// publishes), and what the rollout needs next, derived by the same pure
// decision as `provider-kubernetes plan` (pkg/plan). Build is pure: the
// command reads the API and hands it the rows.
package clusterview

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Node is one row's input: what the API says of a node.
type Node struct {
	Name         string
	ControlPlane bool
	Kubelet      string // status.nodeInfo.kubeletVersion
	Ready        bool
	APIServer    string // a control plane's kube-apiserver (mirror pod image tag), "" unknown
	Annotations  map[string]string
}

// Row is one node in the view.
type Row struct {
	Name      string `json:"name"`
	Role      string `json:"role"` // control-plane or worker
	Kubelet   string `json:"kubelet"`
	Ready     bool   `json:"ready"`
	APIServer string `json:"apiserver,omitempty"`
	Phase     string `json:"phase"`   // the provider's last pass ("" when it never published)
	Outcome   string `json:"outcome"` // converged, refused, failed
	Refusal   string `json:"refusal,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
	Pin       string `json:"pin,omitempty"`
	Bundled   string `json:"bundled,omitempty"`
	LastPass  string `json:"lastPass,omitempty"` // RFC 3339
	Age       string `json:"age,omitempty"`      // since the last pass
	// Next is what this node's next boot would do with the rollout's target
	// pin on the target's image (plan's verdict and actions, or its refusal).
	Next string `json:"next,omitempty"`
}

// View is the table and the rollout's next step.
type View struct {
	Cluster   string `json:"clusterVersion"`
	Target    string `json:"target"`
	Converged bool   `json:"converged"`
	Nodes     []Row  `json:"nodes"`
	NextStep  string `json:"next"`
}

// Build computes the view. cluster is kubeadm-config's version; now ages
// the last passes.
func Build(w version.Window, cluster version.Version, nodes []Node, now time.Time) View {
	v := View{Cluster: str(cluster)}
	// The rollout's target: the newest of the cluster's version, any
	// node's pin and any apiserver.
	target := cluster
	for _, n := range nodes {
		for _, s := range []string{n.Annotations[status.AnnotationPrefix+status.KeyPin], n.APIServer} {
			if x, err := version.ParseReported(s); err == nil && target.Less(x) {
				target = x
			}
		}
	}
	v.Target = str(target)
	sort.Slice(nodes, func(i, j int) bool {
		if nodes[i].ControlPlane != nodes[j].ControlPlane {
			return nodes[i].ControlPlane
		}
		return nodes[i].Name < nodes[j].Name
	})
	var problems, cpsBehind, workersBehind, rejoin []string
	converged := !target.IsZero()
	for _, n := range nodes {
		a := func(k string) string { return n.Annotations[status.AnnotationPrefix+k] }
		r := Row{Name: n.Name, Role: "worker", Kubelet: n.Kubelet, Ready: n.Ready, APIServer: n.APIServer,
			Phase: a(status.KeyPhase), Outcome: a(status.KeyOutcome), Refusal: a(status.KeyRefusal), Reason: a(status.KeyReason),
			Message: a(status.KeyMessage), Pin: a(status.KeyPin), Bundled: a(status.KeyBundled), LastPass: a(status.KeyTime)}
		if n.ControlPlane {
			r.Role = "control-plane"
		}
		if t, err := time.Parse(time.RFC3339, r.LastPass); err == nil {
			r.Age = now.Sub(t).Round(time.Second).String()
		}
		// This node's version, as the provider sees it: a control plane's
		// apiserver, a worker's kubelet.
		nodeV, _ := version.ParseReported(n.Kubelet)
		if n.ControlPlane {
			if x, err := version.ParseReported(n.APIServer); err == nil {
				nodeV = x
			}
		}
		at := !nodeV.IsZero() && nodeV == target
		if kv, err := version.ParseReported(n.Kubelet); err != nil || kv != target {
			at = false
		}
		if !at || !n.Ready || r.Outcome == "refused" || r.Outcome == "failed" {
			converged = false
		}
		if r.Outcome == "refused" || r.Outcome == "failed" {
			why := r.Refusal
			if why == "" {
				why = r.Reason
			}
			problems = append(problems, fmt.Sprintf("%s %s (%s)", n.Name, r.Outcome, why))
		}
		if !at && !target.IsZero() {
			pl := plan.Decide(w, plan.Facts{Member: true, Role: role(n.ControlPlane), Pin: target.String(), Bundled: target, Node: nodeV, Cluster: cluster})
			r.Next = describe(pl)
			if pl.Verdict == plan.VerdictRefuse && (pl.Refusal == plan.SkipLevel || pl.Refusal == plan.PinBehindCluster) {
				// Two minors or more behind the cluster: no image takes it
				// there one minor at a time (the cluster is already past
				// the minor between); it is reset and rejoined.
				rejoin = append(rejoin, n.Name)
			} else if n.ControlPlane {
				cpsBehind = append(cpsBehind, n.Name)
			} else {
				workersBehind = append(workersBehind, n.Name)
			}
		}
		v.Nodes = append(v.Nodes, r)
	}
	v.Converged = converged
	v.NextStep = next(target, cluster, problems, rejoin, cpsBehind, workersBehind, converged)
	return v
}

func role(cp bool) plan.Role {
	if cp {
		return plan.RoleControlPlane
	}
	return plan.RoleWorker
}

// describe is a plan in a few words.
func describe(pl plan.Plan) string {
	switch pl.Verdict {
	case plan.VerdictRefuse:
		return "refuse " + string(pl.Refusal)
	case plan.VerdictNone:
		return "nothing"
	}
	var a []string
	for _, x := range pl.Actions {
		a = append(a, string(x))
	}
	return strings.Join(a, ",")
}

// next is the rollout's next step: control planes first, one at a time
// (the first needs the apply), then the workers; problems first.
func next(target, cluster version.Version, problems, rejoin, cps, workers []string, converged bool) string {
	if target.IsZero() {
		return "the cluster version is unknown"
	}
	if converged {
		return fmt.Sprintf("nothing: every node is converged at %s", target)
	}
	var parts []string
	if len(problems) > 0 {
		parts = append(parts, "look at "+strings.Join(problems, ", ")+" first (provider-kubernetes status on the node; docs/troubleshooting)")
	}
	if len(rejoin) > 0 {
		parts = append(parts, "reset and rejoin "+strings.Join(rejoin, ", ")+" at "+target.String()+": too far behind the cluster to upgrade one minor at a time (docs/reset-and-rejoin)")
	}
	img := fmt.Sprintf("the %s image with pin %s", target.MinorOf(), target)
	switch {
	case len(cps) > 0:
		s := fmt.Sprintf("next: boot %s into %s", cps[0], img)
		if cluster.Less(target) {
			s += " (it runs kubeadm upgrade apply)"
		}
		if len(cps) > 1 {
			s += "; then " + strings.Join(cps[1:], ", then ")
		}
		if len(workers) > 0 {
			s += "; workers after (" + strings.Join(workers, ", ") + ")"
		}
		parts = append(parts, s)
	case len(workers) > 0:
		s := fmt.Sprintf("next: boot %s into %s", workers[0], img)
		if len(workers) > 1 {
			s += "; then " + strings.Join(workers[1:], ", then ")
		}
		parts = append(parts, s)
	case len(rejoin) > 0:
	default:
		parts = append(parts, "every node runs "+target.String()+"; wait for the nodes to be Ready")
	}
	return strings.Join(parts, "; ")
}

func str(v version.Version) string {
	if v.IsZero() {
		return "unknown"
	}
	return v.String()
}

// Print renders the view: a table for a person (every value escaped: a
// node can publish anything in its annotations) or JSON for tools.
func Print(w io.Writer, v View, format string) error {
	if format == "json" {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(v)
	}
	p := status.Printable
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tROLE\tKUBELET\tAPISERVER\tREADY\tPHASE\tOUTCOME\tREFUSAL\tLAST PASS\tNEXT BOOT\n")
	for _, r := range v.Nodes {
		age := "-"
		if r.Age != "" {
			age = r.Age + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\n", p(r.Name), r.Role, p(dash(r.Kubelet)), p(dash(r.APIServer)), r.Ready,
			p(dash(r.Phase)), p(dash(r.Outcome)), p(dash(r.Refusal)), age, p(dash(r.Next)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "cluster %s, target %s: %s\n", p(v.Cluster), p(v.Target), p(v.NextStep))
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
