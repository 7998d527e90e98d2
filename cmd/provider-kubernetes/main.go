// Command provider-kubernetes is the on-node agent that installs and
// upgrades Kubernetes with kubeadm on Kairos. See README.md.
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
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
