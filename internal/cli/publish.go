package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/publish"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// cmdPublish puts the last pass on this node's Node (annotations and
// events), retrying within its budget while the API comes up: run by
// provider-kubernetes-publish.service after every pass. Exit 0 when
// published or when there is nothing to publish (no pass, not a member),
// 1 when the budget ran out.
func cmdPublish(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("publish", stdout, stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	var budget durationFlag = durationFlag(5 * time.Minute)
	fs.Var(&budget, "budget", "how long to keep trying while the API is not reachable (Go duration)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	r := paths.Root(*root)
	log, logFile, err := reconcileLogger(r, stderr)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	err = publish.Run(ctx, publish.Options{Root: r, Budget: time.Duration(budget), APIRequest: reconcile.DefaultBudgets().APIRequest, Log: log})
	switch {
	case err == nil, errors.Is(err, publish.ErrNothing):
		return reconcile.ExitOK
	}
	fmt.Fprintf(stderr, "publish: %s\n", status.Printable(err.Error()))
	return reconcile.ExitFailed
}

// durationFlag is a positive Go duration.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return fmt.Errorf("not a positive Go duration such as 90s or 5m")
	}
	*d = durationFlag(v)
	return nil
}

var _ flag.Value = (*durationFlag)(nil)
