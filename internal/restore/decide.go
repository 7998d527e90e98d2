// Package restore restores this node's stacked etcd member from a snapshot
// (provider-kubernetes restore-etcd), one member at a time, as the upstream
// etcd recovery guide does it for a kubeadm control plane: from the node's
// own etcd manifest (name, peer URLs, data dir), with the bundled etcdutl
// when it matches the etcd that will run the data, only while the static
// control plane is stopped and the snapshot verifies. The old member
// directory is moved aside, never deleted.
//
// It is a pure decision (Decide) over facts gathered before anything
// changes (gather), and a thin executor. Every refusal wraps one of the
// sentinel errors below; several at once are joined, so the operator sees
// everything to fix in one run.
package restore

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Refusals: nothing was changed.
var (
	// ErrNotStopped: the static control plane still runs (its manifests
	// are in place, etcd's ports answer, or its database is held open).
	ErrNotStopped = errors.New("the static control plane is not stopped")
	// ErrBusy: a reconcile pass holds the node's lock.
	ErrBusy = errors.New("a reconcile pass is running")
	// ErrManifest: the etcd manifest to put back cannot be used.
	ErrManifest = errors.New("etcd manifest")
	// ErrUnsafePath: the data dir or a path to it is a symlink, or not a directory.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrSnapshot: the snapshot does not verify or must not be read.
	ErrSnapshot = errors.New("the snapshot does not verify")
	// ErrVersion: the bundled etcdutl, the etcd that will run the data and
	// the etcd that wrote the snapshot do not fit together.
	ErrVersion = errors.New("etcd version mismatch")
	// ErrInitialCluster: the restored cluster's members are not given, or
	// do not include this member as its manifest describes it.
	ErrInitialCluster = errors.New("initial cluster")
	// ErrClusterToken: the token is malformed or the one the old cluster ran with.
	ErrClusterToken = errors.New("cluster token")
)

// BumpRevision is how far the restored revision is raised, with the
// revisions in between marked compacted: the Kubernetes documentation's
// recommendation for a restore, so every watch and informer that saw the
// newer revisions before the restore gets "compacted" and relists instead
// of waiting for revisions that will not come again. The same on every
// member (it is part of the restored state).
const BumpRevision = "1000000000"

// etcdUnversioned is the version etcd gives a database that records none.
const etcdUnversioned = "3.5.0"

// Facts are what was found on the node before anything changes.
type Facts struct {
	// InPlace are the etcd and kube-apiserver manifests still in the
	// kubelet's manifests directory.
	InPlace []string
	// Member is this node's etcd member, from the manifest to put back;
	// MemberErr says why it cannot be used (the facts below that depend on
	// it are then not gathered).
	Member    Member
	MemberErr error
	// PutBack are the manifest files in the directory to put back.
	PutBack []string
	// Version is the kube-apiserver version of the manifests to put back
	// (zero: not there, or unreadable).
	Version version.Version
	// Listening are etcd's addresses that something answers on; Unknown
	// those that could not be told free.
	Listening, Unknown []string
	// DataDirErr: the data dir cannot be used safely.
	DataDirErr error
	// HasMember: <data-dir>/member is there (a directory); InUse: its
	// database is locked by a running etcd.
	HasMember, InUse bool
	// Etcdutl is the bundled etcdutl's own version ("3.6.8").
	Etcdutl    string
	EtcdutlErr error
	// Snapshot is what the bundled etcdutl reports about the snapshot.
	Snapshot    Snapshot
	SnapshotErr error
}

// Snapshot is etcdutl snapshot status of the file.
type Snapshot struct {
	Hash     uint32
	Revision int64
	Keys     int
	Size     int64  // the database's size
	Version  string // the storage version of the etcd that wrote it ("3.6.0")
}

// Request is what the operator asked for.
type Request struct {
	Snapshot  string // host path of the snapshot file
	Manifests string // host path of the directory holding the manifests to put back
	// InitialCluster is every member of the restored cluster, NAME=PEER-URL,...
	InitialCluster string
	// Token is the restored cluster's --initial-cluster-token; Generated
	// when the command made it (the first member).
	Token          string
	TokenGenerated bool
	Now            time.Time
}

// Plan is one member's restore.
type Plan struct {
	Member Member
	// InitialCluster as etcd writes it (sorted): the same string on every member.
	InitialCluster string
	Members        []string // their names, sorted
	Token          string
	TokenGenerated bool
	// Staging is the host path of the fresh data dir etcdutl restores into,
	// inside the data dir (the same filesystem, even when the data dir is a
	// mount point, as on Kairos); Aside the host path the old member
	// directory moves to ("" when there is none).
	Staging, Aside string
	Snapshot       Snapshot
	SnapshotPath   string
	Manifests      string
	PutBack        []string
	Version        version.Version
	// Notes are things the operator should know that do not stop the restore.
	Notes []string
}

// snapshotArg is the file etcdutl reads: its own standard input, the
// descriptor that was opened and checked (no second lookup by path).
const snapshotArg = "/proc/self/fd/0"

// RestoreArgs is the etcdutl command line, its data dir re-based on root.
func (p Plan) RestoreArgs(root paths.Root) []string {
	return []string{"snapshot", "restore", snapshotArg,
		"--name", p.Member.Name,
		"--initial-cluster", p.InitialCluster,
		"--initial-cluster-token", p.Token,
		"--initial-advertise-peer-urls", p.Member.PeerURLs.String(),
		"--data-dir", root.Path(p.Staging),
		"--bump-revision", BumpRevision, "--mark-compacted"}
}

var tokenRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// Decide is the decision: a plan, or every refusal joined.
func Decide(f Facts, r Request) (Plan, error) {
	var refusals []error
	refuse := func(sentinel error, format string, a ...any) {
		refusals = append(refusals, fmt.Errorf("%w: "+format, append([]any{sentinel}, a...)...))
	}

	// The static control plane must be stopped, on every count.
	if len(f.InPlace) > 0 {
		// Where to is the procedure's (its step 1), not --manifests: after
		// an upgrade that is the collected previous version's, which the
		// running version's would replace.
		refuse(ErrNotStopped, "%s still in %s: move the static pod manifests out of it (docs/rollback-and-restore, step 1), then wait until etcd has stopped",
			strings.Join(f.InPlace, " and "), paths.ManifestsDir)
	}
	for _, a := range f.Listening {
		refuse(ErrNotStopped, "something still listens on %s: etcd still runs (the kubelet stops it once its manifest is gone: crictl ps --name etcd)", a)
	}
	for _, a := range f.Unknown {
		refuse(ErrNotStopped, "cannot tell whether %s is free", a)
	}
	if f.InUse {
		refuse(ErrNotStopped, "%s/member/snap/db is held open by a running etcd", f.Member.DataDir)
	}

	m := f.Member
	if f.MemberErr != nil {
		refuse(ErrManifest, "%s/etcd.yaml: %v", r.Manifests, f.MemberErr)
		return Plan{}, errors.Join(refusals...)
	}
	if f.DataDirErr != nil {
		refuse(ErrUnsafePath, "data dir %s: %v", m.DataDir, f.DataDirErr)
	}

	// The bundled etcdutl restores for the etcd that will run the data.
	if f.EtcdutlErr != nil {
		refuse(ErrVersion, "cannot tell the version of the bundled %s: %v", paths.Etcdutl, f.EtcdutlErr)
	} else if u, err := etcdMinor(f.Etcdutl); err != nil {
		refuse(ErrVersion, "the bundled %s reports version %q", paths.Etcdutl, f.Etcdutl)
	} else if u != m.Etcd {
		refuse(ErrVersion, "the bundled %s is %s but the manifest to put back runs etcd %s (%s): restore with the etcdutl of the etcd that will run the data: boot the image that bundles etcd %s and run restore-etcd there",
			paths.Etcdutl, f.Etcdutl, m.Etcd, m.Image, m.Etcd)
	}

	// The snapshot verifies, and the etcd that will run it can.
	// A database that holds no storage version is read by etcd as 3.5
	// (server/storage/schema.UnsafeDetectSchemaVersion): etcd 3.5 wrote
	// none, and etcd 3.6+ records it only a few seconds after it starts,
	// so a snapshot of a young cluster has none either. Decide as etcd will.
	snapVersion := f.Snapshot.Version
	var unversioned string
	if f.SnapshotErr == nil && strings.TrimSpace(snapVersion) == "" {
		snapVersion = etcdUnversioned
		unversioned = fmt.Sprintf("%s records no etcd storage version (etcd 3.5 wrote none, and a newer etcd records it a few seconds after it starts): etcd reads it as %s", r.Snapshot, etcdUnversioned)
	}
	if f.SnapshotErr != nil {
		refuse(ErrSnapshot, "%s: %v", r.Snapshot, f.SnapshotErr)
	} else if s, err := etcdMinor(snapVersion); err != nil {
		refuse(ErrSnapshot, "%s: etcdutl reports no etcd version for it (%q)", r.Snapshot, f.Snapshot.Version)
	} else if s.Major != m.Etcd.Major || s.Minor > m.Etcd.Minor {
		refuse(ErrVersion, "%s was written by etcd %s, newer than the etcd %s that will run it (%s): etcd cannot go back a version; restore a snapshot taken before the upgrade",
			r.Snapshot, s, m.Etcd, m.Image)
	} else if s.Minor+1 < m.Etcd.Minor && unversioned != "" {
		refuse(ErrVersion, "%s: more than one minor older than the etcd %s that will run it: etcd upgrades one minor at a time",
			unversioned, m.Etcd)
	} else if s.Minor+1 < m.Etcd.Minor {
		refuse(ErrVersion, "%s was written by etcd %s, more than one minor older than the etcd %s that will run it: etcd upgrades one minor at a time",
			r.Snapshot, s, m.Etcd)
	}

	// Every member restores with the same members and the same new token.
	p := Plan{Member: m, Token: r.Token, TokenGenerated: r.TokenGenerated, Snapshot: f.Snapshot, SnapshotPath: r.Snapshot,
		Manifests: r.Manifests, PutBack: f.PutBack, Version: f.Version}
	if ic, names, notes, err := initialCluster(m, r.InitialCluster); err != nil {
		refusals = append(refusals, err)
	} else {
		p.InitialCluster, p.Members, p.Notes = ic, names, notes
	}
	if unversioned != "" {
		p.Notes = append(p.Notes, unversioned)
	}
	switch {
	case !tokenRE().MatchString(r.Token):
		refuse(ErrClusterToken, "%q is not a token: 1-128 letters, digits, '.', '_' or '-'", r.Token)
	case r.Token == m.OldToken:
		refuse(ErrClusterToken, "%q is the token the old cluster ran with: a restored cluster needs a new one (give none on the first member and one is made)", r.Token)
	}
	if len(refusals) > 0 {
		return Plan{}, errors.Join(refusals...)
	}

	ts := r.Now.UTC().Format("20060102T150405Z")
	p.Staging = m.DataDir + "/member.restoring-" + ts
	if f.HasMember {
		p.Aside = m.DataDir + "/member.pre-restore-" + ts
	}
	return p, nil
}

// initialCluster checks --initial-cluster against this member's manifest
// and returns it as etcd writes it, with the member names.
func initialCluster(m Member, given string) (string, []string, []string, error) {
	if strings.TrimSpace(given) == "" {
		return "", nil, nil, fmt.Errorf("%w: pass --initial-cluster with every member of the restored cluster, NAME=PEER-URL,... (the same on every member); "+
			"this member's manifest lists %q, the members known when it joined: any that joined later are missing from it", ErrInitialCluster, m.InitialCluster)
	}
	um, err := types.NewURLsMap(given)
	if err != nil {
		return "", nil, nil, fmt.Errorf("%w: --initial-cluster: %v", ErrInitialCluster, err)
	}
	seen := map[string]string{}
	var names []string
	for name, us := range um {
		if name == "" || strings.ContainsAny(name, " \t\n") {
			return "", nil, nil, fmt.Errorf("%w: --initial-cluster: %q is not a member name", ErrInitialCluster, name)
		}
		for _, u := range us {
			if other, ok := seen[u.String()]; ok {
				return "", nil, nil, fmt.Errorf("%w: --initial-cluster: %s is the peer URL of both %s and %s", ErrInitialCluster, u.String(), other, name)
			}
			seen[u.String()] = name
		}
		names = append(names, name)
	}
	sort.Strings(names)
	own, ok := um[m.Name]
	if !ok {
		return "", nil, nil, fmt.Errorf("%w: --initial-cluster does not name this member, %s (its manifest's --name)", ErrInitialCluster, m.Name)
	}
	if own.String() != m.PeerURLs.String() {
		return "", nil, nil, fmt.Errorf("%w: --initial-cluster gives %s the peer URL %s but its manifest advertises %s", ErrInitialCluster, m.Name, own.String(), m.PeerURLs.String())
	}
	// The manifest's own list may lack later members, never hold wrong ones:
	// a member it names that the restored cluster leaves out is worth saying.
	var notes []string
	if old, err := types.NewURLsMap(m.InitialCluster); err == nil {
		for name := range old {
			if _, ok := um[name]; !ok {
				notes = append(notes, fmt.Sprintf("this member's manifest also names %s, which --initial-cluster leaves out: right only if %s was removed from the cluster", name, name))
			}
		}
	}
	sort.Strings(notes)
	return um.String(), names, notes, nil
}
