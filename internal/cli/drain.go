package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kairos-io/provider-kubernetes/internal/drain"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// DrainBudget is drain's default total budget.
const DrainBudget = 10 * time.Minute

// cmdDrain cordons a Node and evicts its pods through the Eviction API
// (internal/drain), before its reboot. Exit 0 drained, 1 failed (the
// budget ended with pods left, the credentials may not, the API did not
// answer), 2 usage, 3 refused (pods no controller manages, without
// --force: nothing changed).
func cmdDrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("drain", stdout, stderr)
	root := fs.String("root", "/", "host root the node's kubelet.conf is read under")
	kubeconfig := fs.String("kubeconfig", "", "a kubeconfig that may drain the node (host path under --root; default: the KUBECONFIG list, else the node's own kubelet.conf)")
	kubeContext := fs.String("context", "", "the kubeconfig context to use (default: its current context)")
	node := fs.String("node", "", "the node to drain (default: the node the kubeconfig's client certificate names, else this host's name)")
	budget := durationFlag(DrainBudget)
	fs.Var(&budget, "budget", "the whole drain's bound, while disruption budgets block (Go duration)")
	force := fs.Bool("force", false, "also evict pods no controller manages: they are not created again anywhere")
	exclude := podNames{}
	fs.Var(exclude, "exclude-pod", "NAMESPACE/NAME of a pod to leave in place, e.g. the pod running this drain (repeatable)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *node != "" && len(validation.IsDNS1123Subdomain(*node)) != 0 {
		return fs.usageError(fmt.Sprintf("--node: a name of %d bytes that is not a node name (not shown)", len(*node)))
	}
	r := paths.Root(*root)
	timeout := reconcile.DefaultBudgets().APIRequest
	src := kubeSource(*kubeconfig, os.Getenv("KUBECONFIG"), *kubeContext)
	var client *kube.Client
	var err error
	if len(src.Files) == 0 {
		// The node's own credentials may drain the node itself.
		client, err = kube.LoadFirst(r, timeout, src.Context, paths.KubeletConf)
	} else {
		client, err = kube.LoadSource(r, timeout, src)
	}
	if err != nil {
		fmt.Fprintf(stderr, "drain: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	name := *node
	if name == "" {
		if name, err = (&observe.Observer{Root: r}).NodeName(client.NodeName); err != nil {
			fmt.Fprintf(stderr, "drain: %s (name it with --node)\n", status.Printable(err.Error()))
			return reconcile.ExitFailed
		}
	}
	log := slog.New(slog.NewTextHandler(fieldsOnly{stderr}, nil))
	res, err := drain.Run(ctx, drain.Config{API: client, Node: name, Budget: time.Duration(budget), Interval: 2 * time.Second, Log: log,
		Options: drain.Options{Force: *force, Exclude: exclude}})
	printDrain(stdout, name, res)
	switch {
	case err == nil:
		return reconcile.ExitOK
	case errors.Is(err, drain.ErrRefused):
		fmt.Fprintf(stderr, "drain: %s\n", status.Printable(err.Error()))
		return reconcile.ExitRefused
	case errors.Is(err, drain.ErrForbidden):
		fmt.Fprintf(stderr, "drain: %s (a node's own kubelet.conf may drain only that node; see docs/drain.md for the credentials a drain needs)\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	fmt.Fprintf(stderr, "drain: %s\n", status.Printable(err.Error()))
	return reconcile.ExitFailed
}

// printDrain prints what a drain did, each name escaped.
func printDrain(w io.Writer, node string, res drain.Result) {
	p := status.Printable
	pods := "pods"
	if len(res.Evicted) == 1 {
		pods = "pod"
	}
	fmt.Fprintf(w, "node %s: %d %s evicted\n", p(node), len(res.Evicted), pods)
	for _, e := range res.Evicted {
		fmt.Fprintf(w, "evicted:  %s\n", p(e))
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(w, "skipped:  %s (%s)\n", p(s.Pod.String()), s.Why)
	}
	for _, name := range res.LeftPods() {
		fmt.Fprintf(w, "left:     %s: %s\n", p(name), p(res.Left[name]))
	}
	for _, b := range res.Blocking {
		fmt.Fprintf(w, "blocking: %s\n", p(b))
	}
	if res.Uncordoned {
		fmt.Fprintf(w, "node %s is schedulable again (it was before the drain)\n", p(node))
	}
}

// podNames is a repeatable NAMESPACE/NAME flag.
type podNames map[string]bool

func (p podNames) String() string { return "" }

func (p podNames) Set(s string) error {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) != 0 || len(validation.IsDNS1123Subdomain(name)) != 0 {
		return fmt.Errorf("not NAMESPACE/NAME (a value of %d bytes, not shown)", len(s))
	}
	p[s] = true
	return nil
}
