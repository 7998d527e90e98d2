// Package clusterconfig parses the Kairos cluster section the provider acts
// on: the file the plugin writes to /run/provider-kubernetes/cluster.yaml
// (the keys of the cloud-config's "cluster:" section), whose "config" is a
// YAML string holding the kubeadm configuration documents by key.
//
// The section is read with Kairos's own type, kairos-sdk's
// clusterplugin.Cluster, decoded the way kairos-sdk decodes it (yaml.v3), so
// what the provider accepts is what Kairos tools parse. The provider is
// stricter than the SDK on top of that: a key the provider reads must have
// the right YAML kind, and every error names the key and the expected form,
// never a value taken from the section (the cluster token lives in it).
package clusterconfig

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode"

	sdk "github.com/kairos-io/kairos-sdk/clusterplugin"
	yaml3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"
)

// ErrInvalid marks a cluster section the provider cannot act on.
var ErrInvalid = errors.New("invalid cluster config")

// ErrProviderConfig marks a problem with the section's providerConfig:
// its shape (found here, matching ErrInvalid too and reading as the
// problem alone) and its keys and values (internal/reconcile's budgets,
// which wrap it under this text). The pass fails such a section as
// ConfigInvalid rather than refusing it as an unreadable pin.
var ErrProviderConfig = errors.New("invalid providerConfig")

// providerConfigError is a problem of providerConfig: its message is the
// problem's, it unwraps to ErrInvalid's chain and it matches
// ErrProviderConfig.
type providerConfigError struct{ error }

func (e providerConfigError) Unwrap() error        { return e.error }
func (e providerConfigError) Is(target error) bool { return target == ErrProviderConfig }

// MaxSize bounds the cluster file and the config string.
const MaxSize = 1 << 20

// Cluster is the cluster section, as kairos-sdk's clusterplugin.Cluster
// carries it (the SDK's Options is Config here, its ProviderOptions
// ProviderConfig; its env, import_local_images, local_images_path and
// cluster_config_path are refused). ClusterToken is a secret: never log a
// Cluster.
type Cluster struct {
	ClusterToken     string            `json:"cluster_token,omitempty"`
	ControlPlaneHost string            `json:"control_plane_host,omitempty"`
	Role             string            `json:"role,omitempty"`
	Config           string            `json:"config,omitempty"`
	ProviderConfig   map[string]string `json:"providerConfig,omitempty"`
	CACerts          []string          `json:"ca_certs,omitempty"`
	// Ignored are warnings for keys the section has that neither Kairos's
	// cluster schema nor the provider knows (a misspelt providerConfig is
	// otherwise silently ignored): each by its line, never quoted.
	Ignored []string `json:"-"`
}

// Kubeadm is the parsed "config" string. Each document is kept as the
// operator wrote it, so what reaches kubeadm is exactly their configuration.
type Kubeadm struct {
	ClusterConfiguration   map[string]any `json:"clusterConfiguration,omitempty"`
	InitConfiguration      map[string]any `json:"initConfiguration,omitempty"`
	JoinConfiguration      map[string]any `json:"joinConfiguration,omitempty"`
	UpgradeConfiguration   map[string]any `json:"upgradeConfiguration,omitempty"`
	KubeletConfiguration   map[string]any `json:"kubeletConfiguration,omitempty"`
	KubeProxyConfiguration map[string]any `json:"kubeProxyConfiguration,omitempty"`
}

// keyKinds are the YAML kinds of the section's keys the provider reads:
// a string key must be a YAML string, not a number, list or map.
var keyKinds = map[string]string{
	"cluster_token":      "a string",
	"control_plane_host": "a string",
	"role":               "a string",
	"config":             "a string",
	"providerConfig":     "a map of strings",
	"ca_certs":           "a list of strings",
}

// unsupported are keys of kairos-sdk's clusterplugin.Cluster the provider
// does not act on: refused by name rather than silently ignored.
var unsupported = map[string]string{
	"env":                 "kubelet and kubeadm settings go in config",
	"import_local_images": "the image's bundled control-plane images are imported by provider-kubernetes-image-import.service",
	"local_images_path":   "the image's bundled control-plane images are imported by provider-kubernetes-image-import.service",
	"cluster_config_path": "the plugin always writes " + "/usr/local/cloud-config/cluster.kairos.yaml",
}

// Parse parses a cluster file: the keys of the cloud-config's cluster:
// section. The error names the offending key and never quotes a value.
func Parse(b []byte) (*Cluster, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%w: file is %d bytes, limit %d", ErrInvalid, len(b), MaxSize)
	}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%w: not YAML: %s", ErrInvalid, RedactYAMLError(err))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || isNull(doc.Content[0]) {
		return nil, fmt.Errorf("%w: empty", ErrInvalid)
	}
	c, problems := fromNode(doc.Content[0])
	if len(problems) > 0 {
		return nil, problems[0]
	}
	return c, nil
}

// ParseCloudConfig reads the cluster: section of a whole cloud-config, as
// kairos-sdk's cluster plugin reads it (into clusterplugin.Config). It
// returns the section's own YAML (what the boot stage writes to the
// cluster file) and nil, nil, nil when there is no cluster: section.
func ParseCloudConfig(b []byte) (*Cluster, []byte, error) {
	c, section, problems := parseCloudConfig(b)
	if len(problems) > 0 {
		return nil, nil, problems[0]
	}
	return c, section, nil
}

// ParseCloudConfigProblems is ParseCloudConfig listing every problem of
// the section's keys, not only the first (the one ParseCloudConfig
// returns); nil, nil when there is no cluster: section.
func ParseCloudConfigProblems(b []byte) (*Cluster, []error) {
	c, _, problems := parseCloudConfig(b)
	return c, problems
}

func parseCloudConfig(b []byte) (*Cluster, []byte, []error) {
	one := func(format string, a ...any) (*Cluster, []byte, []error) {
		return nil, nil, []error{fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)}
	}
	if len(b) > MaxEventConfig {
		return one("the cloud-config is %d bytes, limit %d", len(b), MaxEventConfig)
	}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(b, &doc); err != nil {
		return one("the cloud-config is not YAML: %s", RedactYAMLError(err))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || isNull(doc.Content[0]) {
		return nil, nil, nil
	}
	top := doc.Content[0]
	if top.Kind != yaml3.MappingNode {
		return one("the cloud-config is not a map of keys")
	}
	var section *yaml3.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "cluster" {
			section = top.Content[i+1]
		}
	}
	if section == nil || isNull(section) {
		return nil, nil, nil
	}
	if section.Kind != yaml3.MappingNode {
		return one("cluster: must be a map of the cluster keys")
	}
	c, problems := fromNode(section)
	if len(problems) > 0 {
		return nil, nil, problems
	}
	out, err := yaml3.Marshal(section)
	if err != nil {
		return one("cluster: %s", RedactYAMLError(err))
	}
	if len(out) > MaxSize {
		return one("cluster: is %d bytes, limit %d", len(out), MaxSize)
	}
	return c, out, nil
}

// MaxEventConfig bounds a whole cloud-config handed to the plugin.
const MaxEventConfig = 8 << 20

// fromNode checks the kinds of the keys the provider reads, then decodes
// the section with kairos-sdk's own type. Every key's problem is listed,
// in the section's order.
func fromNode(n *yaml3.Node) (*Cluster, []error) {
	if n.Kind != yaml3.MappingNode {
		return nil, []error{fmt.Errorf("%w: the cluster section is not a map of keys", ErrInvalid)}
	}
	var problems []error
	var ignored []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		want, known := keyKinds[k]
		why, refused := unsupported[k]
		switch {
		case !known && !refused:
			ignored = append(ignored, unknownKey(k, n.Content[i].Line))
		case isNull(v):
		case refused:
			problems = append(problems, fmt.Errorf("%w: %s is a key of Kairos's cluster schema that provider-kubernetes does not use (%s): remove it", ErrInvalid, k, why))
		default:
			problems = append(problems, checkKind(k, want, v)...)
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	var s sdk.Cluster
	if err := n.Decode(&s); err != nil {
		return nil, []error{fmt.Errorf("%w: %s", ErrInvalid, RedactYAMLError(err))}
	}
	return &Cluster{
		ClusterToken:     s.ClusterToken,
		ControlPlaneHost: s.ControlPlaneHost,
		Role:             string(s.Role),
		Config:           s.Options,
		ProviderConfig:   s.ProviderOptions,
		CACerts:          s.CACerts,
		Ignored:          ignored,
	}, nil
}

// unknownKey is the warning for a key of the cluster section nobody reads,
// at line: it names the known key it looks like (case, '-' and '_', a
// trailing s aside), never the key itself.
func unknownKey(k string, line int) string {
	norm := func(s string) string {
		return strings.TrimSuffix(strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s)), "s")
	}
	names := make([]string, 0, len(keyKinds))
	near := ""
	for name := range keyKinds {
		names = append(names, name)
		if norm(name) == norm(k) {
			near = name
		}
	}
	sort.Strings(names)
	w := fmt.Sprintf("cluster: the key at line %d is not one Kairos's cluster schema or provider-kubernetes reads (%s): it is ignored", line, strings.Join(names, ", "))
	if near != "" {
		w += "; did you mean " + near + "?"
	}
	return w
}

// checkKind lists what is wrong with the kind of key's value: nothing, one
// problem, or one per bad entry of a map or list.
func checkKind(key, want string, v *yaml3.Node) []error {
	problems := checkKindOf(key, want, v)
	if key == "providerConfig" {
		for i, p := range problems {
			problems[i] = providerConfigError{p}
		}
	}
	return problems
}

func checkKindOf(key, want string, v *yaml3.Node) []error {
	bad := func(got string) []error {
		if key == "config" {
			return []error{fmt.Errorf("%w: config must be a YAML string holding the kubeadm documents by key (write config: | and indent them), got %s", ErrInvalid, got)}
		}
		return []error{fmt.Errorf("%w: %s must be %s, got %s", ErrInvalid, key, want, got)}
	}
	var problems []error
	switch want {
	case "a string":
		if !isString(v) {
			return bad(kind(v))
		}
	case "a map of strings":
		if v.Kind != yaml3.MappingNode {
			return bad(kind(v))
		}
		var keys []string
		for i := 0; i+1 < len(v.Content); i += 2 {
			if !isString(v.Content[i+1]) && !isScalar(v.Content[i+1]) {
				keys = append(keys, ShownKey(v.Content[i].Value, providerConfigKeys()))
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			problems = append(problems, fmt.Errorf("%w: %s is a flat map of strings (Kairos's schema); the value of %s is not a string: "+
				"write each budget as its own key, budget.<name>: <duration> (e.g. budget.verify: 6m), not the nested budgets: of earlier releases", ErrInvalid, key, k))
		}
	case "a list of strings":
		if v.Kind != yaml3.SequenceNode {
			return bad(kind(v))
		}
		for i, item := range v.Content {
			if !isString(item) {
				problems = append(problems, fmt.Errorf("%w: %s[%d] must be a string", ErrInvalid, key, i))
			}
		}
	}
	return problems
}

func isNull(n *yaml3.Node) bool {
	return n.Kind == yaml3.ScalarNode && n.ShortTag() == "!!null"
}

func isScalar(n *yaml3.Node) bool {
	return n.Kind == yaml3.ScalarNode || (n.Kind == yaml3.AliasNode && n.Alias != nil && n.Alias.Kind == yaml3.ScalarNode)
}

func isString(n *yaml3.Node) bool {
	if n.Kind == yaml3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n.Kind == yaml3.ScalarNode && n.ShortTag() == "!!str"
}

// kind names the YAML kind of a value, never the value itself.
func kind(n *yaml3.Node) string {
	switch n.Kind {
	case yaml3.MappingNode:
		return "a map"
	case yaml3.SequenceNode:
		return "a list"
	case yaml3.AliasNode:
		return "an alias"
	}
	switch n.ShortTag() {
	case "!!bool":
		return "a boolean"
	case "!!int", "!!float":
		return "a number"
	}
	return "a " + n.ShortTag() + " value"
}

// ShownKey is a key as an error may name it: one of the keys the reader
// knows as is, any other described by its length (with the known key it
// nearly matches, when there is one). Looking like a plain name is not
// enough: a words-and-dashes passphrase pasted one line off is one.
func ShownKey(k string, known []string) string {
	for _, n := range known {
		if k == n {
			return k
		}
	}
	hint := ""
	for _, n := range known {
		if nearMiss(k, n) {
			hint = "; did you mean " + n + "?"
			break
		}
	}
	return fmt.Sprintf("a key of %d characters (not shown%s)", len(k), hint)
}

// nearMiss: k is a typo of known (at most two edits apart), a shortening
// of it, or it without its "budget." prefix.
func nearMiss(k, known string) bool {
	if len(k) >= 4 && strings.HasPrefix(known, k) || "budget."+k == known {
		return true
	}
	if d := len(k) - len(known); d > 2 || d < -2 || len(k) > 64 {
		return false
	}
	prev := make([]int, len(known)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(k); i++ {
		cur := make([]int, len(known)+1)
		cur[0] = i
		for j := 1; j <= len(known); j++ {
			cost := 1
			if k[i-1] == known[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(known)] <= 2
}

// BudgetNames are the providerConfig budget.<name> names the provider
// reads (internal/reconcile's Budgets; a test keeps the two equal).
var BudgetNames = []string{"apiRequest", "certificateRenewal", "clusterVersion", "controlPlaneHealth", "controlPlaneReady", "controlPlaneTurn", "etcdSnapshot", "kubeadmBootstrap",
	"kubeadmUpgrade", "kubeletHealthy", "kubeletRestart", "kubeletStart", "localAPI", "verify", "waitForCluster"}

// providerConfigKeys are the providerConfig keys an error may name: the
// budgets, and the nested budgets: of old releases (refused by name).
func providerConfigKeys() []string {
	keys := []string{"budgets", "metrics.textfileDir", "certificates.renewBefore", "images.pin"}
	for _, n := range BudgetNames {
		keys = append(keys, "budget."+n)
	}
	return keys
}

// kubeadmDocKeys are the keys of the config string (Kubeadm's fields).
var kubeadmDocKeys = []string{"clusterConfiguration", "initConfiguration", "joinConfiguration", "upgradeConfiguration", "kubeletConfiguration", "kubeProxyConfiguration"}

// Kubeadm parses the config string.
func (c *Cluster) Kubeadm() (*Kubeadm, error) {
	if len(c.Config) > MaxSize {
		return nil, fmt.Errorf("%w: config is %d bytes, limit %d", ErrInvalid, len(c.Config), MaxSize)
	}
	var k Kubeadm
	if err := yaml.UnmarshalStrict([]byte(c.Config), &k); err != nil {
		return nil, fmt.Errorf("%w: config: %s", ErrInvalid, RedactYAMLError(err))
	}
	return &k, nil
}

// Pin returns clusterConfiguration.kubernetesVersion as written. A value that
// is not a string (kubernetesVersion: 1.37 is a YAML number) is an error.
func (k *Kubeadm) Pin() (string, error) {
	v, ok := k.ClusterConfiguration["kubernetesVersion"]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: clusterConfiguration.kubernetesVersion must be a string such as \"v1.37.2\", got %T", ErrInvalid, v)
	}
	return s, nil
}

// quoted matches what YAML and JSON errors quote of the input (in
// backquotes, quotes or, for a bad map key, after "invalid map key:"): a
// value there may be the token, so it is never repeated.
var quoted = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("`[^`]*`|'[^']*'|\"[^\"]*\"|invalid map key:.*") })

// unknownField is a strict decoder's complaint about a key of the config
// string: unknown by definition, so described (ShownKey), never named.
var unknownField = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`unknown field "([^"]*)"`) })

// RedactYAMLError is a parser's error on one line without any of the
// input it quotes, bounded.
func RedactYAMLError(err error) string {
	var parts []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = unknownField().ReplaceAllStringFunc(l, func(m string) string {
			return "unknown key, " + ShownKey(unknownField().FindStringSubmatch(m)[1], kubeadmDocKeys)
		})
		if l = strings.TrimSpace(quoted().ReplaceAllString(l, "<value>")); l != "" {
			parts = append(parts, l)
		}
	}
	s := strings.Join(parts, " ")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// The bounds of a search for cloud-config files below a directory (/oem):
// MaxCloudConfigFile is kairos-sdk's collector's (v0.25.3: it skips a file
// of 2 MiB or more); the depth and entry bounds are the provider's own, so
// a hostile tree stops a search instead of making it endless.
const (
	MaxCloudConfigFile    = 2<<20 - 1
	MaxCloudConfigDepth   = 8
	MaxCloudConfigEntries = 4096
)

// HasCloudConfigHeader is kairos-sdk's collector.HasValidHeader (v0.25.3):
// a file is a cloud-config to Kairos when one of its first ten lines, its
// trailing space trimmed, is #cloud-config, #kairos-config or #node-config.
func HasCloudConfigHeader(data []byte) bool {
	for _, l := range strings.SplitN(string(data), "\n", 10) {
		switch strings.TrimRightFunc(l, unicode.IsSpace) {
		case "#cloud-config", "#kairos-config", "#node-config":
			return true
		}
	}
	return false
}
