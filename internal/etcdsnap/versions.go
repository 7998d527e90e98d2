package etcdsnap

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// minimumBefore: for an etcd minor a target Kubernetes deploys, the lowest
// member version etcd's upgrade guide allows before the rolling upgrade to
// it. etcd 3.7's guide asks for every 3.6 member at 3.6.11 or later.
var minimumBefore = map[string]string{"3.7": "3.6.11"}

// Member is one etcd member's reported version ("" when it could not be read).
type Member struct {
	Name    string
	Version string
}

type semver struct{ major, minor, patch int }

// parseEtcdVersion parses "3.6.8", "v3.6.8" or an image tag "3.7.0-0".
func parseEtcdVersion(s string) (semver, bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	p := strings.Split(s, ".")
	if len(p) != 3 {
		return semver{}, false
	}
	var n [3]int
	for i, x := range p {
		v, err := strconv.Atoi(x)
		if err != nil || v < 0 {
			return semver{}, false
		}
		n[i] = v
	}
	return semver{n[0], n[1], n[2]}, true
}

func (a semver) less(b semver) bool {
	if a.major != b.major {
		return a.major < b.major
	}
	if a.minor != b.minor {
		return a.minor < b.minor
	}
	return a.patch < b.patch
}

func (a semver) String() string { return fmt.Sprintf("%d.%d.%d", a.major, a.minor, a.patch) }

// VersionRule is the minimum member version before an upgrade to
// targetEtcd ("3.7.0-0"), and whether there is one.
func VersionRule(targetEtcd string) (string, bool) {
	t, ok := parseEtcdVersion(targetEtcd)
	if !ok {
		return "", false
	}
	m, ok := minimumBefore[fmt.Sprintf("%d.%d", t.major, t.minor)]
	return m, ok
}

// Lagging names the members below the minimum for targetEtcd: those on an
// older minor below the minimum, and those whose version is unknown. Sorted
// by name; empty when there is no rule or every member is fine.
func Lagging(targetEtcd string, members []Member) []string {
	min, ok := VersionRule(targetEtcd)
	if !ok {
		return nil
	}
	minV, _ := parseEtcdVersion(min)
	t, _ := parseEtcdVersion(targetEtcd)
	var out []string
	for _, m := range members {
		name := m.Name
		if name == "" {
			name = "(unnamed)"
		}
		v, ok := parseEtcdVersion(m.Version)
		switch {
		case !ok:
			out = append(out, name+"=unknown")
		case v.major == t.major && v.minor >= t.minor || t.major < v.major:
			// Already on the target minor (or newer): nothing to cross.
		case v.less(minV):
			out = append(out, name+"="+v.String())
		}
	}
	sort.Strings(out)
	return out
}

// VersionWarning is the status message for lagging members.
func VersionWarning(k8sTarget, targetEtcd string, lagging []string) string {
	min, _ := VersionRule(targetEtcd)
	t, _ := parseEtcdVersion(targetEtcd)
	return fmt.Sprintf("etcd members below %s before the upgrade to Kubernetes %s (etcd %s): %s. etcd's upgrade guide asks for every member at %s or later first; this is a warning, the upgrade goes on",
		min, k8sTarget, t, strings.Join(lagging, ", "), min)
}
