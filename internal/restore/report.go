package restore

import (
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// Report writes, for a person, what the restore did (or, for a preview,
// would do) and what to do next: on every other member the same command
// with the same snapshot, members and token; once all are restored, the
// manifests back. Host paths as on the node; every value printable.
func Report(w io.Writer, res Result) {
	p := res.Plan
	q := status.Printable
	others := make([]string, 0, len(p.Members))
	for _, n := range p.Members {
		if n != p.Member.Name {
			others = append(others, q(n))
		}
	}
	token := q(p.Token)
	if p.TokenGenerated {
		token += " (new)"
	}
	aside := "none (there was no member directory)"
	if p.Aside != "" {
		aside = q(p.Aside)
	}
	if res.Preview {
		fmt.Fprintf(w, "restore-etcd would restore etcd member %s from %s (revision %d, %d keys, etcd %s data); nothing changed yet.\n",
			q(p.Member.Name), q(p.SnapshotPath), p.Snapshot.Revision, p.Snapshot.Keys, q(dataVersion(p.Snapshot)))
		fmt.Fprintf(w, "  restore into:    %s, its member directory then renamed to %s/member\n", q(p.Staging), q(p.Member.DataDir))
		fmt.Fprintf(w, "  old member dir:  moved aside to %s\n", aside)
		fmt.Fprintf(w, "  members:         %s\n", q(p.InitialCluster))
		if p.TokenGenerated {
			fmt.Fprintf(w, "  cluster token:   a new one, made when run with --yes\n")
		} else {
			fmt.Fprintf(w, "  cluster token:   %s\n", token)
		}
		for _, n := range p.Notes {
			fmt.Fprintf(w, "  note: %s\n", q(n))
		}
		fmt.Fprintf(w, "Run it again with --yes to restore.\n")
		return
	}

	fmt.Fprintf(w, "restore-etcd: etcd member %s restored from %s (revision %d, %d keys, etcd %s data).\n",
		q(p.Member.Name), q(p.SnapshotPath), p.Snapshot.Revision, p.Snapshot.Keys, q(dataVersion(p.Snapshot)))
	fmt.Fprintf(w, "  data:            %s/member (revision raised by %s, compacted)\n", q(p.Member.DataDir), BumpRevision)
	fmt.Fprintf(w, "  old member dir:  %s (moved aside, untouched)\n", aside)
	fmt.Fprintf(w, "  members:         %s\n", q(p.InitialCluster))
	fmt.Fprintf(w, "  cluster token:   %s\n", token)
	for _, n := range p.Notes {
		fmt.Fprintf(w, "  note: %s\n", q(n))
	}
	if len(others) > 0 {
		fmt.Fprintf(w, "\nNext, on each other member (%s): stop its static control plane the same way, copy the same snapshot\n", strings.Join(others, ", "))
		fmt.Fprintf(w, "there (0600, root), and run the same command with this token (the member's name and peer URLs come from its manifest):\n")
		fmt.Fprintf(w, "  provider-kubernetes restore-etcd --snapshot %s --manifests %s \\\n", q(p.SnapshotPath), q(p.Manifests))
		fmt.Fprintf(w, "    --initial-cluster '%s' \\\n", q(p.InitialCluster))
		fmt.Fprintf(w, "    --cluster-token %s --yes\n", q(p.Token))
		fmt.Fprintf(w, "  (--manifests: that node's own directory of the manifests to put back)\n")
		fmt.Fprintf(w, "\nWhen every member is restored, put the manifests back on every control plane:\n")
	} else {
		fmt.Fprintf(w, "\nThis is the only member: put the manifests back now:\n")
	}
	if len(p.PutBack) == 0 {
		fmt.Fprintf(w, "  mv %s/*.yaml %s/\n", q(p.Manifests), paths.ManifestsDir)
	} else {
		for _, f := range p.PutBack {
			fmt.Fprintf(w, "  mv %s/%s %s/\n", q(p.Manifests), q(f), paths.ManifestsDir)
		}
	}
	if ep := clientEndpoint(p.Member); ep != "" && p.Member.CA != "" {
		dir := path.Dir(p.Member.CA)
		fmt.Fprintf(w, "then check every member:\n  %s --endpoints=%s --cacert=%s --cert=%s/healthcheck-client.crt --key=%s/healthcheck-client.key endpoint health --cluster\n",
			paths.Etcdctl, q(ep), q(p.Member.CA), q(dir), q(dir))
	}
	if p.Aside != "" {
		fmt.Fprintf(w, "Once the cluster is healthy, move %s off the node or remove it: it holds every Secret of the\n", aside)
		fmt.Fprintf(w, "cluster as it was, and kubeadm's next upgrade copies the whole data dir into %s.\n", paths.KubeadmTmpDir)
	}
}

// clientEndpoint is the member's first client URL (loopback when it listens there).
func clientEndpoint(m Member) string {
	first := ""
	for _, l := range m.Listen {
		if l.Flag != "--listen-client-urls" {
			continue
		}
		u := l.Scheme + "://" + l.Addr
		if strings.HasPrefix(l.Addr, "127.") || strings.HasPrefix(l.Addr, "[::1]") || strings.HasPrefix(l.Addr, "localhost:") {
			return u
		}
		if first == "" {
			first = u
		}
	}
	return first
}

// dataVersion is the etcd version a snapshot's data is of, as the report
// names it: the storage version it records, else what etcd reads it as.
func dataVersion(s Snapshot) string {
	if strings.TrimSpace(s.Version) == "" {
		return etcdUnversioned + " (none recorded)"
	}
	return s.Version
}
