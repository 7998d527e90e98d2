// Command provider-kubernetes is the on-node agent that installs and
// upgrades Kubernetes with kubeadm on Kairos, and, installed as
// /system/providers/agent-provider-kubernetes, its Kairos plugin. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kairos-io/provider-kubernetes/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Entry(ctx, os.Args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
