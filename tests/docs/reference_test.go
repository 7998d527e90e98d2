package docs_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/imageimport"
	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/publish"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/restore"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// tableRows returns the rows of the markdown tables in text whose first
// cell is one backticked name: name to its cells.
func tableRows(text string) map[string][]string {
	out := map[string][]string{}
	re := regexp.MustCompile("^\\| `([^`]+)` \\|")
	for _, l := range strings.Split(text, "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		out[m[1]] = cells
	}
	return out
}

// docs/reference.md on a worker whose real kubeadm upgrade node failed,
// after the plugin accepted one section and refused the next: the status
// document as JSON has exactly the documented fields, and the files carry
// the documented modes.
func TestReferencePage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "reference.md")
		page := read(t, "reference.md")
		n := kubeadmFails(t, s)
		if err := os.Remove(n.Path(paths.ClusterYipFile)); err != nil {
			t.Fatal(err)
		}
		agentBoot := func(cluster string) pluggable.EventResponse {
			ev, err := pluggable.NewEvent("agent.boot", map[string]string{"config": "#cloud-config\ncluster:\n  cluster_token: " + testutil.Token +
				"\n  control_plane_host: 10.0.0.11\n" + cluster + "  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n"})
			if err != nil {
				t.Fatal(err)
			}
			in, _ := json.Marshal(ev)
			out, code := n.execIn(in, paths.ProviderBin, "agent.boot")
			var resp pluggable.EventResponse
			if err := json.Unmarshal([]byte(out), &resp); err != nil || code != 0 {
				t.Fatalf("the plugin: exit %d %v\n%s", code, err, out)
			}
			return resp
		}
		if r := agentBoot("  role: worker\n"); r.Error != "" {
			t.Fatalf("the plugin refused a good section: %s", r.Error)
		}
		if out, code := n.provider("reconcile"); code != 1 {
			t.Fatalf("reconcile: exit %d\n%s", code, out)
		}
		if r := agentBoot("  role: master\n"); r.Error == "" {
			t.Fatal("the plugin accepted role master")
		}

		// The status document's fields, from the real command.
		out := n.docOK(p, "provider-kubernetes status -o json")
		var doc map[string]any
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		fields := tableRows(section(t, page, "## The status document"))
		for k := range doc {
			if _, ok := fields[k]; !ok {
				t.Errorf("status -o json prints %q: not in docs/reference.md", k)
			}
		}
		for _, k := range []string{"phase", "reason", "message", "role", "member", "pin", "bundled", "nodeVersion", "clusterVersion", "actions", "lastAction", "time", "bootID", "events"} {
			if _, ok := doc[k]; !ok {
				t.Errorf("status -o json of a failed upgrade has no %q", k)
			}
		}

		// The modes, as stat reports them, against the Files table.
		files := tableRows(section(t, page, "## Files"))
		out = n.docOK(p, "stat -c ")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 7 {
			t.Fatalf("stat printed %d files, want the 7 it names:\n%s", len(lines), out)
		}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) != 3 {
				t.Fatalf("stat line %q", l)
			}
			row, ok := files[f[2]]
			if !ok {
				t.Fatalf("%s is not in docs/reference.md's Files table", f[2])
			}
			if row[1] != "0"+f[0] || f[1] != "root:root" {
				t.Errorf("%s is %s %s; docs/reference.md says %s root:root", f[2], f[0], f[1], row[1])
			}
		}
	})
}

// The status document's JSON fields, its phases and the Node annotations
// are the reference's, both ways.
func TestReferenceStatusFields(t *testing.T) {
	page := read(t, "reference.md")
	sec := section(t, page, "## The status document")
	rows := tableRows(sec)
	var tags []string
	ty := reflect.TypeOf(status.Document{})
	for i := 0; i < ty.NumField(); i++ {
		tag := strings.Split(ty.Field(i).Tag.Get("json"), ",")[0]
		tags = append(tags, tag)
		if _, ok := rows[tag]; !ok {
			t.Errorf("status field %q is not in docs/reference.md", tag)
		}
	}
	for k := range rows {
		if !contains(tags, k) {
			t.Errorf("docs/reference.md documents a status field %q the document does not have", k)
		}
	}
	for _, name := range []string{"count", "bytes", "dir"} {
		if !strings.Contains(rows["kubeadmEtcdBackups"][2], "`"+name+"`") {
			t.Errorf("kubeadmEtcdBackups.%s is not documented", name)
		}
	}
	phases := values(consts(t, "internal/status", func(n string) bool { return strings.HasPrefix(n, "Phase") }))
	phases = append(phases, values(consts(t, "internal/restore", func(n string) bool { return strings.HasPrefix(n, "Phase") }))...)
	for _, ph := range phases {
		if !strings.Contains(rows["phase"][2], "`"+ph+"`") {
			t.Errorf("phase %s is not in docs/reference.md", ph)
		}
	}
	for _, ev := range values(consts(t, "internal/status", func(n string) bool { return strings.HasPrefix(n, "Event") })) {
		if !strings.Contains(rows["events"][2], "`"+ev+"`") {
			t.Errorf("Event reason %s is not in docs/reference.md", ev)
		}
	}
	annotations := oneLine(sec[strings.Index(sec, "annotations on the Node"):])
	for k := range status.Annotations(status.Document{}) {
		k = strings.TrimPrefix(k, status.AnnotationPrefix)
		if !strings.Contains(annotations, "`"+k+"`") {
			t.Errorf("the Node annotation %s%s is not in docs/reference.md", status.AnnotationPrefix, k)
		}
	}
	if !strings.Contains(annotations, "`"+status.AnnotationPrefix+"`") {
		t.Error("the annotations' prefix is not in docs/reference.md")
	}
}

// Every budget key is a row with its default; the bounds the text states
// are the code's.
func TestReferenceBudgets(t *testing.T) {
	page := read(t, "reference.md")
	sec := section(t, page, "## providerConfig")
	rows := tableRows(sec)
	def := reconcile.DefaultBudgets()
	b, _ := json.Marshal(def)
	var byName map[string]time.Duration
	if err := json.Unmarshal(b, &byName); err != nil {
		t.Fatal(err)
	}
	keys := reconcile.BudgetKeys()
	if len(keys) != len(byName) {
		t.Fatalf("%d keys, %d budgets", len(keys), len(byName))
	}
	for _, k := range keys {
		row, ok := rows[k]
		if !ok {
			t.Errorf("%s is not in docs/reference.md", k)
			continue
		}
		d, err := time.ParseDuration(row[1])
		if want := byName[strings.TrimPrefix(k, reconcile.BudgetKeyPrefix)]; err != nil || d != want {
			t.Errorf("%s: docs/reference.md says %q, the default is %s", k, row[1], want)
		}
	}
	// The one key that is not a budget: the metrics textfile's directory.
	if row, ok := rows[metrics.Key]; !ok || len(row) < 3 || row[1] != "`"+metrics.DefaultDir+"`" || !strings.Contains(row[2], "`"+metrics.Off+"`") {
		t.Errorf("docs/reference.md: %s is not documented with its default %s and %s: %q", metrics.Key, metrics.DefaultDir, metrics.Off, row)
	}
	// And the opt-in certificate renewal's threshold, off by default.
	if row, ok := rows[certs.RenewBeforeKey]; !ok || len(row) < 3 || !strings.Contains(row[1], "off") || !strings.Contains(row[2], "`"+strings.TrimSuffix(certs.MaxRenewBefore.String(), "0m0s")+"`") {
		t.Errorf("docs/reference.md: %s is not documented as off by default with its bound %s: %q", certs.RenewBeforeKey, certs.MaxRenewBefore, row)
	}
	// And the bundled images' pins, on by default: the pass's own check of
	// the value is what a documented value must pass.
	if row, ok := rows[imageimport.PinKey]; !ok || len(row) < 3 || row[1] != "`\"true\"`" || !strings.Contains(row[2], "`\"false\"`") {
		t.Errorf("docs/reference.md: %s is not documented as \"true\" by default, \"false\" to turn it off: %q", imageimport.PinKey, row)
	}
	for _, v := range []string{"true", "false"} {
		if _, err := imageimport.PinWanted(map[string]string{imageimport.PinKey: v}); err != nil {
			t.Errorf("%s: %q: %v", imageimport.PinKey, v, err)
		}
	}
	for k := range rows {
		if !contains(keys, k) && k != metrics.Key && k != certs.RenewBeforeKey && k != imageimport.PinKey {
			t.Errorf("docs/reference.md documents %s, not a providerConfig key", k)
		}
	}
	text := oneLine(sec)
	for _, want := range []string{"never raised above " + short(reconcile.MaxEtcdSnapshot), "the " + strings.TrimSuffix(short(reconcile.PassBound), "m") + "-minute pass bound",
		"`restore-etcd` " + short(restore.Bound) + " in all"} {
		if !strings.Contains(text, want) {
			t.Errorf("docs/reference.md does not say %q", want)
		}
	}
}

// short is a whole number of minutes as the page writes it: 2m, 50m.
func short(d time.Duration) string {
	return fmt.Sprintf("%dm", d/time.Minute)
}

// Every unit the image ships is a row with its ExecStart and its timeout.
func TestReferenceUnits(t *testing.T) {
	rows := tableRows(section(t, read(t, "reference.md"), "## Units"))
	dir := filepath.Join(repo(), "system", "units")
	var units []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".service") {
			return err
		}
		units = append(units, filepath.Base(p))
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		row, ok := rows[filepath.Base(p)]
		if !ok {
			t.Errorf("unit %s is not in docs/reference.md", filepath.Base(p))
			return nil
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "ExecStart="); ok && !strings.Contains(row[1], "`"+v+"`") {
				t.Errorf("%s runs %q; docs/reference.md says %s", filepath.Base(p), v, row[1])
			}
			if v, ok := strings.CutPrefix(l, "TimeoutStartSec="); ok && !strings.Contains(row[2], v) {
				t.Errorf("%s has TimeoutStartSec=%s; docs/reference.md says %s", filepath.Base(p), v, row[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(units)
	if len(units) < 5 {
		t.Fatalf("units %v", units)
	}
	for k := range rows {
		if !contains(units, k) {
			t.Errorf("docs/reference.md documents a unit %s the image does not ship", k)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The Node condition's table is publish's mapping: every phase is a row,
// and each row's status and reason are what publish sets for that phase
// (a refusal's and a failure's reason taken from the pass).
func TestReferenceNodeCondition(t *testing.T) {
	sec := section(t, read(t, "reference.md"), "## The Node condition")
	rows := tableRows(sec)
	phases := values(consts(t, "internal/status", func(n string) bool { return strings.HasPrefix(n, "Phase") }))
	phases = append(phases, values(consts(t, "internal/restore", func(n string) bool { return strings.HasPrefix(n, "Phase") }))...)
	for _, ph := range phases {
		row, ok := rows[ph]
		if !ok {
			t.Errorf("phase %s has no row in docs/reference.md's Node condition", ph)
			continue
		}
		d := status.Document{Phase: ph, Refusal: "SkipLevel", Reason: "KubeadmFailed"}
		if ph == status.PhaseRefused {
			d.Reason = "UpgradeRefused"
		}
		c := publish.Condition(d, nil, time.Now())
		if row[1] != "`"+c.Status+"`" {
			t.Errorf("phase %s: docs/reference.md says status %s, publish sets %s", ph, row[1], c.Status)
		}
		if !strings.Contains(row[2], "`"+c.Reason+"`") {
			t.Errorf("phase %s: docs/reference.md's reason %q does not show %s, which publish sets", ph, row[2], c.Reason)
		}
	}
	if len(rows) != len(phases) {
		t.Errorf("docs/reference.md's Node condition has %d rows, %d phases", len(rows), len(phases))
	}
	if !strings.Contains(oneLine(sec), "the condition `"+publish.ConditionType+"`") {
		t.Errorf("docs/reference.md does not name the condition %s", publish.ConditionType)
	}
}

// upgrade.md's version table is images/versions.yaml, row for row.
func TestUpgradeVersionTable(t *testing.T) {
	rows := tableRows(section(t, read(t, "upgrade.md"), "## What each image bundles"))
	m := images.Get()
	if len(rows) != len(m.Minors) {
		t.Errorf("upgrade.md's table has %d image rows, versions.yaml %d minors", len(rows), len(m.Minors))
	}
	for _, e := range m.Minors {
		row, ok := rows[e.ImageTag]
		if !ok {
			t.Errorf("upgrade.md's table has no row for %s", e.ImageTag)
			continue
		}
		want := []string{"`" + e.ImageTag + "`", e.Kubernetes, e.Etcd, e.CoreDNS, e.Pause}
		if strings.Join(row, "|") != strings.Join(want, "|") {
			t.Errorf("upgrade.md's row for %s is %q, versions.yaml says %q", e.ImageTag, row, want)
		}
	}
}

// TestReferenceMetrics: the Metrics section names every metric the
// textfile carries (a control plane's, which has them all), and no other.
func TestReferenceMetrics(t *testing.T) {
	page := read(t, "reference.md")
	rows := tableRows(section(t, page, "## Metrics"))
	d := status.Document{Phase: status.PhaseConverged, Pin: "v1.37.2", NodeVersion: "v1.37.2", Time: "2026-12-03T12:00:00Z",
		Certificates: &status.Certificates{Soonest: &status.Certificate{Name: "apiserver", NotAfter: "2027-12-03T11:00:00Z"}}}
	names := map[string]bool{}
	for _, l := range strings.Split(string(metrics.Render(d)), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if _, ok := rows[f[2]]; !ok {
				t.Errorf("docs/reference.md does not document the metric %s", f[2])
			}
		}
	}
	for k := range rows {
		if !names[k] {
			t.Errorf("docs/reference.md documents %s, which the textfile does not carry", k)
		}
	}
	if len(names) != 5 {
		t.Fatalf("%d metrics: %v", len(names), names)
	}
}

// TestReferenceAnnotations: the annotations docs/reference.md promises
// `publish` sets are exactly the ones it sets, every one on every publish
// (present and empty when the document has no value); `outcome` takes only
// the page's values, each of them for some phase; `message` is at most the
// page's bound in bytes however long the pass's message.
func TestReferenceAnnotations(t *testing.T) {
	sec := oneLine(section(t, read(t, "reference.md"), "## The status document"))
	i := strings.Index(sec, "`publish` also sets these annotations on the Node")
	if i < 0 {
		t.Fatal("docs/reference.md no longer lists publish's annotations")
	}
	para := sec[i:]
	// The names: the backticked words outside parentheses (inside them
	// are a name's values or what it holds).
	var names []string
	depth := 0
	var outside strings.Builder
	for _, r := range para {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		default:
			if depth == 0 {
				outside.WriteRune(r)
			}
		}
	}
	for _, m := range regexp.MustCompile("`([a-z-]+)`").FindAllStringSubmatch(outside.String(), -1) {
		if m[1] != "publish" {
			names = append(names, m[1])
		}
	}
	if !strings.Contains(para, "`"+status.AnnotationPrefix+"` + ") || len(names) < 10 {
		t.Fatalf("docs/reference.md's annotation list did not parse: %q", names)
	}
	empty := status.Annotations(status.Document{})
	full := status.Document{Phase: status.PhaseConverged, Role: "controlplane", Member: true, NodeVersion: "v1.37.2", VerifiedVersion: "v1.37.2",
		Pin: "v1.37.2", Bundled: "v1.37.2", ClusterVersion: "v1.37.2", Refusal: "SkipLevel", Reason: "UpgradeRefused", Message: "m",
		LastAction: "verify", Time: "2026-12-03T12:00:00Z", BootID: "b-1",
		Certificates: &status.Certificates{Soonest: &status.Certificate{Name: "apiserver", NotAfter: "2027-12-03T11:00:00Z"}}}
	set := status.Annotations(full)
	for _, k := range names {
		if v, ok := empty[status.AnnotationPrefix+k]; !ok || v != "" {
			t.Errorf("%s%s: not set empty when the document has no value (set %v, %q)", status.AnnotationPrefix, k, ok, v)
		}
		if set[status.AnnotationPrefix+k] == "" {
			t.Errorf("%s%s: empty for a document that has its value", status.AnnotationPrefix, k)
		}
	}
	if len(empty) != len(names) || len(set) != len(names) {
		t.Errorf("publish sets %d annotations (%d with every value), docs/reference.md lists %d: %q", len(empty), len(set), len(names), names)
	}

	// outcome's values, as the page gives them.
	om := regexp.MustCompile("`outcome` \\(([^)]*)\\)").FindStringSubmatch(para)
	if om == nil {
		t.Fatal("docs/reference.md does not give outcome's values")
	}
	want := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z]+)`").FindAllStringSubmatch(om[1], -1) {
		want[m[1]] = true
	}
	seen := map[string]bool{}
	for _, ph := range values(consts(t, "internal/status", func(n string) bool { return strings.HasPrefix(n, "Phase") })) {
		got := status.Annotations(status.Document{Phase: ph})[status.AnnotationPrefix+"outcome"]
		if got != "" && !want[got] {
			t.Errorf("phase %s: outcome %q, not one of docs/reference.md's %v", ph, got, om[1])
		}
		seen[got] = true
	}
	for v := range want {
		if !seen[v] {
			t.Errorf("docs/reference.md's outcome %q is set for no phase", v)
		}
	}

	// message: at most N bytes.
	mm := regexp.MustCompile("`message` \\(at most (\\d+) bytes\\)").FindStringSubmatch(para)
	if mm == nil {
		t.Fatal("docs/reference.md does not bound the message annotation")
	}
	bound, _ := strconv.Atoi(mm[1])
	for _, n := range []int{bound - 1, bound, bound + 1, 4 << 10} {
		d := full
		// Words: a long run of one letter reads as a secret and is masked.
		m := []byte(strings.Repeat("the apiserver is down. ", n/23+1)[:n])
		m[n-1] = '.'
		d.Message = string(m)
		if got := status.Annotations(d)[status.AnnotationPrefix+"message"]; len(got) > bound || (n <= bound && got != d.Message) {
			t.Errorf("a message of %d bytes is annotated as %d bytes (%q...), docs/reference.md says at most %d", n, len(got), got[:min(len(got), 20)], bound)
		}
	}
}
