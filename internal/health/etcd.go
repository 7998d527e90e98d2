package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/etcdclient"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
)

// EtcdTLS loads a client TLS config from PEM files (kubeadm's
// healthcheck-client certificate and the etcd CA), refusing symlinks.
func EtcdTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	ca, err := fsutil.ReadFileNoFollow(caFile, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("etcd ca: %w", err)
	}
	crt, err := fsutil.ReadFileNoFollow(certFile, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("etcd client cert: %w", err)
	}
	key, err := fsutil.ReadFileNoFollow(keyFile, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("etcd client key: %w", err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, errors.New("etcd client certificate and key do not form a pair")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("etcd ca: no certificate")
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// EtcdMembers is one attempt: through seed, list the members; every member
// must be started and answer Status on a client URL, and no alarm may be raised.
func EtcdMembers(ctx context.Context, seed string, tlsCfg *tls.Config) error {
	cli := etcdclient.New(seed, tlsCfg, DefaultAttempt)
	defer cli.Close()
	members, err := cli.MemberList(ctx, false)
	if err != nil {
		return fmt.Errorf("etcd member list via %s: %w", seed, err)
	}
	var bad []string
	for _, m := range members {
		name := m.Name
		if name == "" {
			name = fmt.Sprintf("%x", m.ID)
		}
		if len(m.ClientURLs) == 0 {
			bad = append(bad, name+": not started")
			continue
		}
		if _, err := cli.Status(ctx, m.ClientURLs[0]); err != nil {
			bad = append(bad, fmt.Sprintf("%s (%s): %v", name, m.ClientURLs[0], err))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("etcd members unhealthy: %s", strings.Join(bad, "; "))
	}
	al, err := cli.AlarmList(ctx)
	if err != nil {
		return fmt.Errorf("etcd alarm list: %w", err)
	}
	if len(al) > 0 {
		return fmt.Errorf("etcd alarm raised: %v", al[0].Type)
	}
	return nil
}
