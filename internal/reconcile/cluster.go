package reconcile

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// The cluster-wide gates: what every control plane's apiserver serves, read
// from each apiserver itself (its /version and /readyz at the address it
// keeps in the default/kubernetes endpoints). That works with a worker's
// own credentials (kubelet.conf may get those endpoints and call /version,
// but may neither list Nodes nor read other nodes' pods) and gives the
// version each apiserver really serves.

// apiserver is one apiserver as it answered for itself.
type apiserver struct {
	Addr    string          // ip:port from the kubernetes endpoints
	Node    string          // the control-plane Node at that address, when known
	Version version.Version // zero: unknown
	Ready   bool
	Err     string // why the version or readiness is unknown
}

func (a apiserver) name() string {
	if a.Node != "" {
		return a.Node + " (" + a.Addr + ")"
	}
	return a.Addr
}

// behind is the pure decision of the cluster-wide gates: every apiserver
// must serve a version in [lo, hi] and be Ready; the others are named with
// why, sorted. missing names control planes without an apiserver in the
// endpoints (their apiserver is down): they count as behind.
func behind(servers []apiserver, missing []string, lo, hi version.Version) []string {
	var out []string
	for _, a := range servers {
		switch {
		case a.Version.IsZero():
			out = append(out, fmt.Sprintf("%s: version unknown (%s)", a.name(), a.Err))
		case a.Version.Less(lo) || hi.Less(a.Version):
			out = append(out, fmt.Sprintf("%s at %s", a.name(), a.Version))
		case !a.Ready:
			out = append(out, fmt.Sprintf("%s at %s, not ready (%s)", a.name(), a.Version, a.Err))
		}
	}
	for _, m := range missing {
		out = append(out, m+": no apiserver in the kubernetes endpoints (down?)")
	}
	sort.Strings(out)
	return out
}

// older reports a control plane behind target for certain: an apiserver
// serving an older version, or a control plane with none in the endpoints
// (down). One not Ready, or whose version is unknown, is not.
func older(servers []apiserver, missing []string, target version.Version) bool {
	for _, a := range servers {
		if !a.Version.IsZero() && a.Version.Less(target) {
			return true
		}
	}
	return len(missing) > 0
}

// apiservers asks every apiserver of the kubernetes endpoints for its
// version and readiness (each request bounded by the client's timeout).
func apiservers(ctx context.Context, client *kube.Client) ([]apiserver, error) {
	addrs, err := client.APIServers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]apiserver, 0, len(addrs))
	for _, addr := range addrs {
		a := apiserver{Addr: addr}
		c, err := client.At(addr)
		if err != nil {
			a.Err = err.Error()
			out = append(out, a)
			continue
		}
		if a.Version, err = c.ServerVersion(ctx); err != nil {
			a.Err = err.Error()
		} else if err := c.Readyz(ctx); err != nil {
			a.Err = err.Error()
		} else {
			a.Ready = true
		}
		out = append(out, a)
	}
	return out, nil
}

// nameControlPlanes puts the control-plane Node names on the apiservers
// and returns the control planes with no apiserver in the endpoints. A
// control plane's apiserver is the endpoint kubeadm recorded on its
// kube-apiserver mirror pod (what it advertises, and so what it keeps in
// the endpoints); the Node's own addresses are used only for a node with
// no such pod of its own: the kubelet's InternalIP need not be the address
// the apiserver advertises (a host with IPv6 router advertisements gives
// the kubelet an IPv6 address beside the IPv4 one kubeadm advertises).
// Needs list on Nodes and kube-system pods (admin.conf): without it, the
// error.
func nameControlPlanes(ctx context.Context, admin *kube.Client, servers []apiserver) (missing []string, err error) {
	nodes, err := admin.ControlPlaneNodes(ctx)
	if err != nil {
		return nil, err
	}
	advertised, err := admin.AdvertisedAPIServers(ctx)
	if err != nil {
		return nil, err
	}
	byEndpoint, byHost := map[string]int{}, map[string]int{}
	for i, a := range servers {
		if ep, ok := kube.CanonicalEndpoint(a.Addr); ok {
			byEndpoint[ep] = i
			host, _, _ := net.SplitHostPort(ep)
			byHost[host] = i
		}
	}
	for _, n := range nodes {
		i, ok := 0, false
		if a, found := advertised[n.Name]; found && a.OfNode(n.UID) {
			i, ok = byEndpoint[a.Endpoint]
		} else {
			for _, addr := range n.Addresses {
				if ip := net.ParseIP(addr); ip != nil {
					if i, ok = byHost[ip.String()]; ok {
						break
					}
				}
			}
		}
		if ok {
			servers[i].Node = n.Name
			continue
		}
		missing = append(missing, n.Name)
	}
	return missing, nil
}

// addonImages are the kube-proxy and CoreDNS tags the target kubeadm
// deploys: kube-proxy at the Kubernetes version, CoreDNS at the tag the
// image's bundle lists (what that kubeadm deploys).
func addonImages(target version.Version, bundleImages []string) (proxy, coredns string) {
	proxy = target.String()
	for _, ref := range bundleImages {
		name := ref
		if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
			name = name[:i]
		}
		if strings.HasSuffix(name, "/coredns") {
			coredns = observe.ImageTag(ref)
		}
	}
	return proxy, coredns
}

// addonsAt checks kube-proxy and CoreDNS: at the expected tags, rolled out
// and available. A missing add-on (kubeadm's addon phase skipped by the
// operator) is noted, not waited on.
func addonsAt(ctx context.Context, admin *kube.Client, proxyTag, corednsTag string) (notes []string, err error) {
	check := func(kind, name, want string, get func(context.Context, string, string) (kube.Rollout, error)) error {
		r, err := get(ctx, "kube-system", name)
		if err != nil {
			if kube.IsNotFound(err) {
				notes = append(notes, fmt.Sprintf("%s kube-system/%s is not deployed: not verified", kind, name))
				return nil
			}
			return err
		}
		if want != "" && observe.ImageTag(r.Image) != want {
			return fmt.Errorf("%s kube-system/%s runs %s, want tag %s", kind, name, r.Image, want)
		}
		if !r.Done() {
			return fmt.Errorf("%s kube-system/%s not rolled out: %d desired, %d updated, %d total, %d available%s", kind, name, r.Desired, r.Updated, r.Total, r.Available, notReadyNodes(ctx, admin))
		}
		return nil
	}
	if err := check("daemonset", "kube-proxy", proxyTag, admin.DaemonSet); err != nil {
		return notes, err
	}
	if err := check("deployment", "coredns", corednsTag, admin.Deployment); err != nil {
		return notes, err
	}
	return notes, nil
}

// notReadyNodes says which Nodes are not Ready, for a rollout that is not
// done: a DaemonSet replaces one node's pod at a time, and the pod of a
// node that is down stays terminating, which holds the whole rollout (the
// kube-proxy of every other node included) until that node is back or its
// Node is deleted. Empty when every Node is Ready or they cannot be listed.
func notReadyNodes(ctx context.Context, admin *kube.Client) string {
	nodes, err := admin.Nodes(ctx)
	if err != nil {
		return ""
	}
	var names []string
	for _, n := range nodes {
		if !n.Ready {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	more := ""
	if len(names) > 5 {
		names, more = names[:5], fmt.Sprintf(" and %d more", len(names)-5)
	}
	return fmt.Sprintf("; Nodes not Ready: %s%s (a node that is down holds a DaemonSet's rollout until it is back or its Node is deleted)", strings.Join(names, ", "), more)
}
