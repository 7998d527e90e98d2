package docs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// The Kairos operator's CRDs (v0.1.3, tests/docs/testdata/kairos-operator/SOURCE).
const operatorCRDs = "testdata/kairos-operator"

// examples/fleet/: every object is one the operator's CRDs accept (the
// real openAPIV3Schema, walked: unknown fields refused, types, int32
// ranges, minimums and required fields checked); every image is the
// newest minor's of images/versions.yaml, as upgrade.md names it; the pin
// bump runs upgrade.md's `pin set` and the upgrade's preflight
// fleet-upgrade.md's `preflight`, each with only flags reference.md's
// synopsis lists, beneath the NodeOp's hostMountPath; the upgrade goes one
// node at a time and stops at the first failure; fleet-upgrade.md links
// every example and shows the upgrade in full.
func TestFleetExamples(t *testing.T) {
	crds := loadCRDs(t)
	target := images.Get().Minors[len(images.Get().Minors)-1]
	if len(images.Get().Minors) < 2 || images.Get().Minors[len(images.Get().Minors)-2].Minor != "1.36" || target.Minor != "1.37" {
		t.Fatalf("versions.yaml's last two minors are not 1.36 and 1.37: the fleet examples and page are about 1.36 -> 1.37 (%+v)", images.Get().Minors)
	}
	upgradeImage := strings.TrimPrefix(docCommand(t, "upgrade.md", "kairos-agent upgrade --source oci:"), "kairos-agent upgrade --source oci:")
	if !strings.HasSuffix(upgradeImage, ":"+target.ImageTag) {
		t.Fatalf("upgrade.md upgrades to %q, not the %s image tag of versions.yaml (%s)", upgradeImage, target.Minor, target.ImageTag)
	}

	objs := fleetExamples(t)
	for file, o := range objs {
		c, ok := crds[o.APIVersion+"/"+o.Kind]
		if !ok {
			t.Errorf("examples/fleet/%s: %s %s is no kind of the operator's CRDs", file, o.APIVersion, o.Kind)
			continue
		}
		for _, e := range validateObject(o.raw, c) {
			t.Errorf("examples/fleet/%s: %s", file, e)
		}
		for _, img := range []string{o.Spec.Image, o.Spec.Preflight.Image} {
			if img != "" && img != upgradeImage {
				t.Errorf("examples/fleet/%s: image %q, not upgrade.md's %s image %q", file, img, target.Minor, upgradeImage)
			}
		}
		if o.Spec.Image == "" {
			t.Errorf("examples/fleet/%s: no image (the operator would run busybox)", file)
		}
	}
	pin, upgrade := objs["01-pin.yaml"], objs["02-upgrade.yaml"]
	if pin == nil || upgrade == nil {
		t.Fatalf("examples/fleet/ lacks 01-pin.yaml or 02-upgrade.yaml: %v", keys(objs))
	}

	// The pin bump: upgrade.md's command, re-based on the host mount.
	want := docCommand(t, "upgrade.md", "provider-kubernetes pin set ") + " --root " + pin.Spec.HostMountPath
	if got := commandLine(pin.Spec.Command); pin.Kind != "NodeOp" || got != want {
		t.Errorf("examples/fleet/01-pin.yaml: command %q, want upgrade.md's pin set beneath the host mount: %q", got, want)
	}
	if !strings.HasSuffix(want, "pin set "+target.Kubernetes+" --root "+pin.Spec.HostMountPath) {
		t.Errorf("the pin bump %q does not pin versions.yaml's %s (%s)", want, target.Minor, target.Kubernetes)
	}
	synopsis(t, pin.Spec.Command)
	if pin.Spec.RebootOnSuccess || pin.Spec.Cordon {
		t.Error("examples/fleet/01-pin.yaml: the pin bump cordons or reboots: it should change the cloud-config only")
	}

	// The upgrade: the page's preflight, one node at a time, stopping at
	// the first failure, rebooting into the swapped image.
	if upgrade.Kind != "NodeOp" || upgrade.Spec.Preflight.Command == nil {
		t.Fatalf("examples/fleet/02-upgrade.yaml: a %s without a preflight", upgrade.Kind)
	}
	want = docCommand(t, "fleet-upgrade.md", "provider-kubernetes preflight ")
	if got := commandLine(upgrade.Spec.Preflight.Command); got != want || !strings.HasSuffix(got, "--host-root "+upgrade.Spec.HostMountPath) {
		t.Errorf("examples/fleet/02-upgrade.yaml: preflight %q, want fleet-upgrade.md's %q with the host mount %q", got, want, upgrade.Spec.HostMountPath)
	}
	synopsis(t, upgrade.Spec.Preflight.Command)
	if upgrade.Spec.Concurrency != 1 || !upgrade.Spec.StopOnFailure || !upgrade.Spec.RebootOnSuccess || !upgrade.Spec.Cordon || upgrade.Spec.NodeSelector != nil {
		t.Errorf("examples/fleet/02-upgrade.yaml: concurrency %d, stopOnFailure %v, rebootOnSuccess %v, cordon %v, nodeSelector %v: want one node at a time, every node, stop at the first failure, cordon, reboot",
			upgrade.Spec.Concurrency, upgrade.Spec.StopOnFailure, upgrade.Spec.RebootOnSuccess, upgrade.Spec.Cordon, upgrade.Spec.NodeSelector != nil)
	}
	if s := strings.Join(upgrade.Spec.Command, " "); !strings.Contains(s, "mount --rbind "+upgrade.Spec.HostMountPath+"/dev /dev") ||
		!strings.Contains(s, "kairos-agent upgrade --source dir:/ --exclude-path '/etc/hostname' --exclude-path '/etc/hosts'") {
		t.Errorf("examples/fleet/02-upgrade.yaml: the Job is not the NodeOpUpgrade's swap of the active slot: %q", s)
	}

	// The page links every example and shows the upgrade as it is.
	page := read(t, "fleet-upgrade.md")
	for file := range objs {
		if !strings.Contains(page, "](../examples/fleet/"+file+")") {
			t.Errorf("docs/fleet-upgrade.md does not link examples/fleet/%s", file)
		}
	}
	if shown := yamlBlock(t, page); shown != string(upgrade.text) {
		t.Errorf("docs/fleet-upgrade.md shows a NodeOp that is not examples/fleet/02-upgrade.yaml:\n%s", shown)
	}
}

// The pin bump's command as the operator's Job runs it: the 1.37 image's
// provider-kubernetes with the node's root writable at /host; the node's
// /oem cloud-config then pins v1.37.2 and nothing else of it changed.
func TestFleetPinExampleRuns(t *testing.T) {
	o := fleetExamples(t)["01-pin.yaml"]
	if o == nil {
		t.Fatal("no examples/fleet/01-pin.yaml")
	}
	inSandbox(t, func(t *testing.T, s *sandbox) {
		host := s.node("w1")
		host.clusterFile("worker", "v1.36.3", "")
		host.image("v1.36.3")
		before := testutil.CloudConfig("worker", "v1.36.3")
		host.Write("/oem/90_custom.yaml", before, 0o600)

		job := s.node("job")
		job.image("v1.37.2")
		if err := os.MkdirAll(job.Path(o.Spec.HostMountPath), 0o755); err != nil {
			t.Fatal(err)
		}
		job.mount(host.Root, strings.TrimPrefix(o.Spec.HostMountPath, "/"), "", unix.MS_BIND|unix.MS_REC, "")
		out, code := job.exec(o.Spec.Command...)
		if code != 0 || !strings.Contains(out, "/oem/90_custom.yaml: pin v1.36.3 -> v1.37.2") {
			t.Fatalf("the example's pin set: exit %d\n%s", code, out)
		}
		after, err := os.ReadFile(host.Path("/oem/90_custom.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if string(after) != strings.Replace(before, "v1.36.3", "v1.37.2", 1) {
			t.Fatalf("the node's cloud-config after the example's pin set:\n%s", after)
		}
		if out, code := host.provider("pin", "show"); code != 0 || !strings.Contains(out, "v1.37.2") {
			t.Fatalf("pin show on the node: exit %d\n%s", code, out)
		}
	})
}

// fleetObject is what the tests read of an example: the fields they
// check, the object as JSON for the schema walk, the file's text.
type fleetObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Image           string   `json:"image"`
		HostMountPath   string   `json:"hostMountPath"`
		Command         []string `json:"command"`
		Concurrency     int      `json:"concurrency"`
		StopOnFailure   bool     `json:"stopOnFailure"`
		Cordon          bool     `json:"cordon"`
		RebootOnSuccess bool     `json:"rebootOnSuccess"`
		NodeSelector    any      `json:"nodeSelector"`
		Preflight       struct {
			Image   string   `json:"image"`
			Command []string `json:"command"`
		} `json:"preflight"`
	} `json:"spec"`
	raw  any
	text []byte
}

// fleetExamples reads examples/fleet/*.yaml, one object each.
func fleetExamples(t *testing.T) map[string]*fleetObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repo(), "examples", "fleet", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("examples/fleet: %v %v", files, err)
	}
	out := map[string]*fleetObject{}
	for _, f := range files {
		name := filepath.Base(f)
		if filepath.Ext(name) != ".yaml" {
			t.Errorf("examples/fleet/%s: not a .yaml object", name)
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("\n---")) {
			t.Errorf("examples/fleet/%s: one object per file, applied in the files' order", name)
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			t.Fatalf("examples/fleet/%s: %v", name, err)
		}
		o := &fleetObject{text: b}
		d := json.NewDecoder(bytes.NewReader(j))
		d.UseNumber()
		if err := d.Decode(&o.raw); err != nil {
			t.Fatal(err)
		}
		// The fields the tests read; a wrong type is the schema walk's to name.
		if err := json.Unmarshal(j, o); err != nil {
			t.Errorf("examples/fleet/%s: %v", name, err)
		}
		out[name] = o
	}
	return out
}

// crdSchema is one served version of a CustomResourceDefinition.
type crdSchema struct {
	group, version, kind string
	root                 *schema
}

// schema is the part of an OpenAPI v3 schema the operator's CRDs use.
type schema struct {
	Type                 string             `json:"type"`
	Format               string             `json:"format"`
	Properties           map[string]*schema `json:"properties"`
	Items                *schema            `json:"items"`
	AdditionalProperties *schema            `json:"additionalProperties"`
	Required             []string           `json:"required"`
	Minimum              *float64           `json:"minimum"`
	Maximum              *float64           `json:"maximum"`
	Enum                 []any              `json:"enum"`
	Preserve             bool               `json:"x-kubernetes-preserve-unknown-fields"`
	IntOrString          bool               `json:"x-kubernetes-int-or-string"`
}

// loadCRDs reads the operator's CRDs, by "group/version/Kind".
func loadCRDs(t *testing.T) map[string]crdSchema {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(operatorCRDs, "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("the operator's CRDs in %s: %v %v", operatorCRDs, files, err)
	}
	out := map[string]crdSchema{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Group    string                `json:"group"`
				Names    struct{ Kind string } `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Served bool   `json:"served"`
					Schema struct {
						OpenAPIV3Schema *schema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil || crd.Kind != "CustomResourceDefinition" {
			t.Fatalf("%s: not a CustomResourceDefinition: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			c := crdSchema{crd.Spec.Group, v.Name, crd.Spec.Names.Kind, v.Schema.OpenAPIV3Schema}
			out[c.group+"/"+c.version+"/"+c.kind] = c
		}
	}
	return out
}

// validateObject walks an object against its CRD's schema as the
// apiserver would refuse it: the apiVersion and kind, metadata as
// ObjectMeta (a name, a namespace; no status), and every field of the
// schema's types, unknown fields refused (the apiserver would prune them:
// the operator would never see them).
func validateObject(obj any, c crdSchema) []string {
	m, ok := obj.(map[string]any)
	if !ok {
		return []string{"not an object"}
	}
	var errs []string
	if m["apiVersion"] != c.group+"/"+c.version || m["kind"] != c.kind {
		errs = append(errs, fmt.Sprintf("apiVersion %v kind %v, not %s/%s %s", m["apiVersion"], m["kind"], c.group, c.version, c.kind))
	}
	meta, _ := m["metadata"].(map[string]any)
	for k, v := range meta {
		s, isString := v.(string)
		switch {
		case k != "name" && k != "namespace":
			errs = append(errs, "metadata."+k+": not used by the examples")
		case !isString:
			errs = append(errs, "metadata."+k+": not a string")
		case k == "name" && len(validation.IsDNS1123Subdomain(s)) > 0,
			k == "namespace" && len(validation.IsDNS1123Label(s)) > 0:
			errs = append(errs, "metadata."+k+": not a valid name")
		}
	}
	if name, _ := meta["name"].(string); name == "" {
		errs = append(errs, "metadata.name: missing")
	}
	if _, ok := m["status"]; ok {
		errs = append(errs, "status: set by the operator, not applied")
	}
	rest := map[string]any{}
	for k, v := range m {
		if k != "metadata" && k != "status" {
			rest[k] = v
		}
	}
	return append(errs, walk("", rest, c.root)...)
}

// walk checks v against s; path names the field.
func walk(at string, v any, s *schema) []string {
	where := at
	if where == "" {
		where = "the object"
	}
	bad := func(f string, a ...any) []string { return []string{where + ": " + fmt.Sprintf(f, a...)} }
	if v == nil {
		return bad("null")
	}
	var errs []string
	if len(s.Enum) > 0 {
		found := false
		for _, e := range s.Enum {
			if fmt.Sprint(e) == fmt.Sprint(v) {
				found = true
			}
		}
		if !found {
			errs = append(errs, where+": not one of the schema's values")
		}
	}
	switch s.Type {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return bad("not an object")
		}
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				errs = append(errs, join(at, r)+": required")
			}
		}
		for _, k := range sortedKeys(m) {
			switch p, ok := s.Properties[k]; {
			case ok:
				errs = append(errs, walk(join(at, k), m[k], p)...)
			case s.AdditionalProperties != nil:
				errs = append(errs, walk(join(at, k), m[k], s.AdditionalProperties)...)
			case !s.Preserve:
				errs = append(errs, join(at, k)+": unknown field")
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return bad("not an array")
		}
		for i, e := range a {
			if s.Items == nil {
				return bad("an array without an item schema")
			}
			errs = append(errs, walk(fmt.Sprintf("%s[%d]", at, i), e, s.Items)...)
		}
	case "string":
		if _, ok := v.(string); !ok {
			return bad("not a string")
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return bad("not a boolean")
		}
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return bad("not an integer")
		}
		i, err := n.Int64()
		if err != nil {
			return bad("not an integer")
		}
		if s.Format == "int32" && (i < math.MinInt32 || i > math.MaxInt32) {
			errs = append(errs, where+": out of int32's range")
		}
		if s.Minimum != nil && float64(i) < *s.Minimum {
			errs = append(errs, fmt.Sprintf("%s: below the minimum %v", where, *s.Minimum))
		}
		if s.Maximum != nil && float64(i) > *s.Maximum {
			errs = append(errs, fmt.Sprintf("%s: above the maximum %v", where, *s.Maximum))
		}
	default:
		return bad("the schema's type %q is not one this walk knows", s.Type)
	}
	return errs
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keys(m map[string]*fleetObject) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// docCommand is the one command of a page that starts with prefix.
func docCommand(t *testing.T, page, prefix string) string {
	t.Helper()
	c, err := docs.Command(page, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// commandLine is a container command as a page writes it: the provider's
// binary by its name, arguments joined by spaces.
func commandLine(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	if argv[0] == paths.ProviderBin {
		argv = append([]string{path.Base(paths.ProviderBin)}, argv[1:]...)
	}
	return strings.Join(argv, " ")
}

// synopsis checks a provider-kubernetes command against reference.md's
// synopsis of it: its subcommand words begin one, and each of its flags
// is one that synopsis lists.
func synopsis(t *testing.T, argv []string) {
	t.Helper()
	if len(argv) < 2 || argv[0] != paths.ProviderBin {
		t.Errorf("%q does not run %s", argv, paths.ProviderBin)
		return
	}
	var words, flags []string
	for _, a := range argv[1:] {
		switch {
		case strings.HasPrefix(a, "-"):
			flags = append(flags, a)
		case len(flags) == 0 && regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(a):
			words = append(words, a)
		}
	}
	sub := strings.Join(words, " ")
	cell := regexp.MustCompile("`" + regexp.QuoteMeta(sub) + `( [^` + "`" + `]*)?` + "`")
	for _, row := range strings.Split(section(t, read(t, "reference.md"), "## Commands"), "\n") {
		for _, syn := range cell.FindAllString(row, -1) {
			ok := true
			for _, f := range flags {
				if !regexp.MustCompile(`\[` + regexp.QuoteMeta(f) + `[ \]=]`).MatchString(syn) {
					ok = false
				}
			}
			if ok {
				return
			}
		}
	}
	t.Errorf("reference.md's Commands table has no synopsis of %q with the flags %q", sub, flags)
}
