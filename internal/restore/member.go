package restore

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"slices"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/types"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// DefaultToken is etcd's --initial-cluster-token when none is given: what
// a kubeadm cluster runs with (kubeadm never sets one).
const DefaultToken = "etcd-cluster"

// Member is one etcd member as its static pod manifest describes it.
type Member struct {
	Name     string
	PeerURLs types.URLs // --initial-advertise-peer-urls, sorted
	DataDir  string     // --data-dir, a clean absolute host path
	// Listen is every address etcd listens on (client, peer, metrics).
	Listen []Listener
	// InitialCluster is the manifest's --initial-cluster: the members known
	// when this one joined, so possibly not all of them.
	InitialCluster string
	// OldToken is the manifest's --initial-cluster-token, else DefaultToken.
	OldToken string
	Image    string        // the etcd container's image
	Etcd     version.Minor // its tag's major.minor: the etcd that runs the data
	// CA is --trusted-ca-file: kubeadm's healthcheck client certificate
	// is next to it (for the check printed after the restore).
	CA string
}

// Listener is an address etcd listens on and the flag that says so.
type Listener struct {
	Addr   string // host:port to dial
	Flag   string
	Scheme string
}

// ParseMember reads an etcd static pod manifest (kubeadm's etcd.yaml).
func ParseMember(b []byte) (Member, error) {
	flags, err := observe.ManifestFlags(b, "etcd")
	if err != nil {
		return Member{}, err
	}
	m := Member{Name: flags["name"], DataDir: flags["data-dir"], InitialCluster: flags["initial-cluster"], OldToken: flags["initial-cluster-token"],
		CA: flags["trusted-ca-file"]}
	if m.Name == "" || strings.ContainsAny(m.Name, "=, \t\n") {
		return Member{}, fmt.Errorf("--name %q is not a member name", m.Name)
	}
	if m.DataDir == "" {
		m.DataDir = paths.EtcdDir
	}
	if !path.IsAbs(m.DataDir) || path.Clean(m.DataDir) != m.DataDir || m.DataDir == "/" {
		return Member{}, fmt.Errorf("--data-dir %q is not a clean absolute path", m.DataDir)
	}
	if w := flags["wal-dir"]; w != "" {
		return Member{}, fmt.Errorf("--wal-dir %q is set: a separate WAL directory is not supported, restore by hand", w)
	}
	if m.OldToken == "" {
		m.OldToken = DefaultToken
	}
	peers := flags["initial-advertise-peer-urls"]
	if peers == "" {
		return Member{}, fmt.Errorf("no --initial-advertise-peer-urls")
	}
	if m.PeerURLs, err = types.NewURLs(strings.Split(peers, ",")); err != nil {
		return Member{}, fmt.Errorf("--initial-advertise-peer-urls: %w", err)
	}
	for _, l := range []struct{ flag, def string }{
		{"listen-client-urls", "http://localhost:2379"},
		{"listen-peer-urls", "http://localhost:2380"},
		{"listen-metrics-urls", ""},
	} {
		v := flags[l.flag]
		if v == "" {
			v = l.def
		}
		ls, err := listeners(v, "--"+l.flag)
		if err != nil {
			return Member{}, fmt.Errorf("--%s: %w", l.flag, err)
		}
		for _, x := range ls {
			if !slices.ContainsFunc(m.Listen, func(y Listener) bool { return y.Addr == x.Addr }) {
				m.Listen = append(m.Listen, x)
			}
		}
	}
	if m.Image, err = observe.ManifestImage(b, "etcd"); err != nil {
		return Member{}, err
	}
	if m.Etcd, err = etcdMinor(observe.ImageTag(m.Image)); err != nil {
		return Member{}, fmt.Errorf("image %q: %w", m.Image, err)
	}
	return m, nil
}

// listeners turns a comma-separated URL list into host:port addresses to
// dial: an unspecified host (0.0.0.0, ::) is dialled on loopback.
func listeners(list, flag string) ([]Listener, error) {
	var out []Listener
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil {
			return nil, err
		}
		if u.Scheme == "unix" || u.Scheme == "unixs" {
			continue
		}
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || port == "" {
			return nil, fmt.Errorf("%q is not a host:port URL", s)
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
			if ip.To4() == nil {
				host = "::1"
			}
		}
		out = append(out, Listener{Addr: net.JoinHostPort(host, port), Flag: flag, Scheme: u.Scheme})
	}
	return out, nil
}

// etcdMinor parses the major.minor of "3.6.8", "v3.6.8" or an image tag
// "3.6.8-0" (kubeadm's etcd images carry a build suffix).
func etcdMinor(s string) (version.Minor, error) {
	t := strings.TrimSpace(s)
	if i := strings.IndexAny(t, "-+"); i >= 0 {
		t = t[:i]
	}
	v, err := version.ParseReported(t)
	if err != nil {
		return version.Minor{}, fmt.Errorf("%q is not an etcd version", s)
	}
	return v.MinorOf(), nil
}
