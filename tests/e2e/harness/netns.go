package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// The private network: a bridge br0 (BridgeIP/24) in the cluster's own
// bridge namespace; each node in its own namespace with a veth eth0
// (10.0.0.(10+index)/24) whose peer is enslaved to br0, a default route via
// the bridge (kubeadm takes the node address from the default route), and
// routes to the other nodes' pod subnets. Nothing is routed to or from the
// host's namespace: the host reaches nodes only through nsenter.

const netnsDir = "/run/netns"

// NodeIP is the address of node number index (1-based).
func NodeIP(index int) string { return fmt.Sprintf("10.0.0.%d", 10+index) }

// PodSubnet is the pod subnet of node number index (1-based).
func PodSubnet(index int) string { return fmt.Sprintf("10.244.%d.0/24", index) }

type netOps struct {
	r     runner.Runner
	tools tools
}

func (n netOps) ip(ctx context.Context, args ...string) error {
	res, err := n.r.Run(ctx, runner.Cmd{Path: n.tools.path("ip"), Args: args, Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("ip %s: %w (%s)", strings.Join(args, " "), err, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

func netnsExists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return err == nil
}

// bridgeSteps and nodeSteps are the ip(8) command lines, in order (pure, so
// the wiring is asserted without root).
func bridgeSteps(ns string) [][]string {
	return [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
		{"-n", ns, "addr", "add", BridgeIP + "/24", "dev", "br0"},
		{"-n", ns, "link", "set", "br0", "up"},
	}
}

func nodeSteps(ns, bridgeNS, veth, ip string) [][]string {
	return [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		// No dummy driver on this kernel; a veth pair it is.
		{"-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", veth, "netns", bridgeNS},
		{"-n", bridgeNS, "link", "set", veth, "master", "br0"},
		{"-n", bridgeNS, "link", "set", veth, "up"},
		{"-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", BridgeIP, "dev", "eth0"},
	}
}

func podRouteStep(ns, subnet, via string) []string {
	return []string{"-n", ns, "route", "replace", subnet, "via", via, "dev", "eth0"}
}

func (n netOps) run(ctx context.Context, steps [][]string) error {
	for _, s := range steps {
		if err := n.ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// forward turns on IPv4 forwarding inside a node's namespace (pods' traffic
// to other nodes is routed by the node). /proc/sys/net is the writer's
// namespace's, so the write happens from a process inside it.
func (n netOps) forward(ctx context.Context, ns string) error {
	res, err := n.r.Run(ctx, runner.Cmd{
		Path:    n.tools.path("nsenter"),
		Args:    []string{"--net=" + filepath.Join(netnsDir, ns), "--", "/bin/sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("ip_forward in %s: %w (%s)", ns, err, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

func (n netOps) del(ctx context.Context, ns string) error {
	if !netnsExists(ns) {
		return nil
	}
	err := n.ip(ctx, "netns", "del", ns)
	if err != nil && !netnsExists(ns) {
		return nil
	}
	return err
}

func (n netOps) delAll(ctx context.Context, names []string) error {
	var errs []error
	for _, ns := range names {
		errs = append(errs, n.del(ctx, ns))
	}
	return errors.Join(errs...)
}
