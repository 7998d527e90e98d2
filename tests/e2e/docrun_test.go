package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// docPage is a docs/ page whose <!-- e2e --> commands the suite runs in
// the nodes as the page writes them (issue 15): taken from the page's own
// text, so a changed flag or path in the page fails here.
type docPage struct {
	t testing.TB
	p *docs.Page
}

func openDoc(t testing.TB, name string) *docPage {
	t.Helper()
	p, err := docs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	return &docPage{t: t, p: p}
}

// cmd is the page's end-to-end command that is (or starts with) prefix,
// recorded as run.
func (d *docPage) cmd(prefix string) string {
	d.t.Helper()
	c, err := d.p.E2ECommand(prefix)
	if err != nil {
		d.t.Fatal(err)
	}
	return c
}

// runLine runs one command line in hn as the operator would after sudo:
// root, `sh -c` of the line, PATH as a login shell's, with env
// ("NAME=value") giving a page's $VARIABLES. It returns what the line
// printed and its exit code.
func runLine(t testing.TB, hn *haNode, line string, env ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append([]string{"/usr/bin/env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, env...)
	res, err := hn.n.Exec(ctx, append(args, "/bin/sh", "-c", line)...)
	out := string(res.Stdout) + string(res.Stderr)
	if err != nil && res.ExitCode == 0 {
		t.Fatalf("%s: %s: %v\n%s", hn.name, line, err, out)
	}
	return out, res.ExitCode
}

// run runs the page's command that is (or starts with) prefix in hn
// (runLine) and fails the test unless it succeeds.
func (d *docPage) run(hn *haNode, prefix string, env ...string) string {
	d.t.Helper()
	line := d.cmd(prefix)
	out, code := runLine(d.t, hn, line, env...)
	if code != 0 {
		d.t.Fatalf("%s: docs/%s: %s: exit %d\n%s", hn.name, d.p.Name, line, code, out)
	}
	progress(d.t, "%s: docs/%s: %s", hn.name, d.p.Name, line)
	return out
}

// until runs the page's command until it succeeds and what it printed
// satisfies ok, within budget (a check the page says to make once
// something has come up).
func (d *docPage) until(hn *haNode, prefix string, budget time.Duration, ok func(string) bool, env ...string) string {
	d.t.Helper()
	return d.untilExit(hn, prefix, budget, func(out string, code int) bool { return code == 0 && ok(out) }, env...)
}

// untilExit is until for a command whose failure can also be the expected
// answer: ok sees what it printed and its exit code.
func (d *docPage) untilExit(hn *haNode, prefix string, budget time.Duration, ok func(out string, code int) bool, env ...string) string {
	d.t.Helper()
	line := d.cmd(prefix)
	deadline := time.Now().Add(budget)
	for {
		out, code := runLine(d.t, hn, line, env...)
		if ok(out, code) {
			progress(d.t, "%s: docs/%s: %s", hn.name, d.p.Name, line)
			return out
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: docs/%s: %s: exit %d, not yet as expected after %s\n%s", hn.name, d.p.Name, line, code, budget, out)
		}
		// Every attempt that is not yet as expected is in the log: the
		// first one's answer is often what explains the last.
		progress(d.t, "%s: docs/%s: not yet (exit %d): %s", hn.name, d.p.Name, code, finalLine(out))
		time.Sleep(3 * time.Second)
	}
}

// finalLine is the last non-empty line of out.
func finalLine(out string) string {
	l := strings.Split(strings.TrimSpace(out), "\n")
	return l[len(l)-1]
}

// imageSource is the page's `kairos-agent upgrade --source`: the per-minor
// image it installs.
var imageSource = regexp.MustCompile(`^kairos-agent upgrade --source oci:\S+:v[0-9.]+-k8s(1\.[0-9]+)$`)

// bootImage stands in for the page's `kairos-agent upgrade --source
// oci:...-k8sX.Y` and `reboot`: nspawn nodes have no A/B partitions, so the
// harness swaps the node's OS tree to that minor's image tree while it is
// off, then boots it. It returns the boot's pass exit code.
func (d *docPage) bootImage(hn *haNode, trees map[string]string, what string) int {
	d.t.Helper()
	up := d.cmd("kairos-agent upgrade --source")
	m := imageSource.FindStringSubmatch(up)
	if m == nil || trees[m[1]] == "" {
		d.t.Fatalf("docs/%s: %q names no image tree the suite has", d.p.Name, up)
	}
	d.cmd("reboot")
	stopNode(d.t, hn)
	if err := hn.n.SetTree(trees[m[1]]); err != nil {
		d.t.Fatal(err)
	}
	return bootNode(d.t, hn.n, what+" ("+m[1]+" image: "+up+")")
}

// reboot is the page's `reboot`: the node stopped and booted again; it
// returns the boot's pass exit code.
func (d *docPage) reboot(hn *haNode, what string) int {
	d.t.Helper()
	d.cmd("reboot")
	stopNode(d.t, hn)
	return bootNode(d.t, hn.n, what)
}

// done fails the test when an end-to-end command of the page was never run.
func (d *docPage) done() {
	d.t.Helper()
	if u := d.p.UnrunE2E(); len(u) > 0 {
		d.t.Fatalf("docs/%s: end-to-end commands no test ran: %q", d.p.Name, u)
	}
}

func stopNode(t testing.TB, hn *haNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := hn.n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// memberList parses `etcdctl member list` (ID, status, name, peer URLs,
// client URLs, is learner): name to ID, and name=peer URL joined as
// --initial-cluster wants.
func memberList(t testing.TB, out string) (ids map[string]string, initialCluster string) {
	t.Helper()
	ids = map[string]string{}
	var parts []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(l, ", ")
		if len(f) != 6 {
			t.Fatalf("member list line %q", l)
		}
		ids[f[2]] = f[0]
		parts = append(parts, f[2]+"="+f[3])
	}
	return ids, strings.Join(parts, ",")
}

// healthy is `etcdctl endpoint health --cluster` listing n members, every
// one healthy (a member that has not started since the restore has no
// client URL yet and is not listed at all).
func healthy(n int) func(string) bool {
	return func(out string) bool {
		return strings.Count(out, " is healthy") == n && !strings.Contains(out, "unhealthy")
	}
}
