package pin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"reflect"
	"strings"
	"unicode/utf8"

	yaml3 "gopkg.in/yaml.v3"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// location is where the pin is in a cloud-config.
type location struct {
	value      string // the scalar's value, as written
	start, end int    // byte offsets of its characters (inside any quotes)
	lineStart  int    // byte offset of the line holding them
	line       int    // that line's number (1-based)
	// editErr is why the value, though it reads, cannot be edited in
	// place; the pin still shows.
	editErr error
}

// The path to the pin: the cloud-config's cluster: section, its config
// string, and in that the kubeadm documents' clusterConfiguration.
const pinKey = "clusterConfiguration.kubernetesVersion"

// locate finds the pin in a cloud-config's first document (the one Kairos
// reads). has reports whether the document sets the cluster: section's
// config; err, with has, why its pin cannot be read, and without it why
// the file cannot be read at all.
func locate(data []byte) (loc location, has bool, err error) {
	var doc yaml3.Node
	if err := yaml3.Unmarshal(data, &doc); err != nil {
		return loc, false, fmt.Errorf("not YAML: %s", clusterconfig.RedactYAMLError(err))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || doc.Content[0].Kind != yaml3.MappingNode {
		return loc, false, nil
	}
	var why []string // why it cannot be edited in place
	cluster, err := entry(doc.Content[0], "cluster", "the cloud-config", "", &why)
	if err != nil {
		return loc, true, err
	}
	if cluster == nil || cluster.Kind != yaml3.MappingNode {
		return loc, false, nil // no section; a malformed one is the plugin's to refuse
	}
	config, err := entry(cluster, "config", "cluster:", "cluster.", &why)
	if err != nil {
		return loc, true, err
	}
	if config == nil || config.Kind == yaml3.ScalarNode && config.ShortTag() == "!!null" {
		return loc, false, nil
	}
	if config.Kind != yaml3.ScalarNode || config.ShortTag() != "!!str" {
		return loc, true, errors.New("the cluster: section's config is not a string (write config: | and indent the kubeadm documents under it)")
	}
	switch {
	case config.Style&yaml3.LiteralStyle != 0:
	case config.Style&yaml3.FoldedStyle != 0:
		why = append(why, "config is a folded block (config: >), whose lines YAML joins: pin edits only a literal block (config: |)")
	default:
		why = append(why, "config is written as a quoted or plain string: pin edits only a literal block (config: |)")
	}
	var inner yaml3.Node
	if err := yaml3.Unmarshal([]byte(config.Value), &inner); err != nil {
		return loc, true, fmt.Errorf("the cluster: section's config is not YAML: %s", clusterconfig.RedactYAMLError(err))
	}
	if inner.Kind == 0 || len(inner.Content) == 0 || inner.Content[0].Kind != yaml3.MappingNode {
		return loc, true, errors.New("the cluster: section's config is not a map of kubeadm documents by key")
	}
	cc, err := entry(inner.Content[0], "clusterConfiguration", "config", "", &why)
	if err != nil {
		return loc, true, err
	}
	if cc == nil || cc.Kind != yaml3.MappingNode {
		return loc, true, fmt.Errorf("config has no clusterConfiguration map, so no %s (the pin): add it by hand once, as in examples/cloud-config", pinKey)
	}
	val, err := entry(cc, "kubernetesVersion", "clusterConfiguration", "clusterConfiguration.", &why)
	if err != nil {
		return loc, true, err
	}
	if val == nil || val.Kind == yaml3.ScalarNode && val.ShortTag() == "!!null" {
		return loc, true, fmt.Errorf("%s is not set: add it by hand once, as in examples/cloud-config", pinKey)
	}
	if val.Kind != yaml3.ScalarNode {
		return loc, true, fmt.Errorf("%s is not a single value", pinKey)
	}
	loc.value = val.Value
	if p, ok := pluginPin(data); ok && p != loc.value {
		return loc, true, fmt.Errorf("the plugin reads another %s than this one (a key given twice, in another case?)", pinKey)
	}
	switch {
	case val.Style&yaml3.TaggedStyle != 0:
		why = append(why, pinKey+" carries an explicit tag")
	case val.Style&(yaml3.LiteralStyle|yaml3.FoldedStyle) != 0 || strings.ContainsAny(val.Value, "\r\n"):
		why = append(why, pinKey+" spans several lines")
	}
	if len(why) == 0 {
		why = append(why, place(data, config, val, &loc)...)
	}
	if len(why) > 0 {
		loc.editErr = errors.New(why[0])
	}
	return loc, true, nil
}

// entry is the value of key in the map m (where names m for a person,
// prefix is put before key to name its value): nil when absent. A key given twice, or a merge
// key (<<) that could set it, cannot be read for sure; an alias or an
// anchor on the way means an edit would change more than the pin (why).
func entry(m *yaml3.Node, key, where, prefix string, why *[]string) (*yaml3.Node, error) {
	name := prefix + key
	var val *yaml3.Node
	n := 0
	for i := 0; i+1 < len(m.Content); i += 2 {
		switch k := m.Content[i]; {
		case k.Kind == yaml3.ScalarNode && k.Value == "<<" && k.Style&(yaml3.SingleQuotedStyle|yaml3.DoubleQuotedStyle) == 0:
			return nil, fmt.Errorf("%s uses a merge key (<<), which may set %s: pin cannot tell which value counts", where, key)
		case k.Value == key:
			val = m.Content[i+1]
			n++
		}
	}
	if n > 1 {
		return nil, fmt.Errorf("%s sets %s %d times", where, key, n)
	}
	if val == nil {
		return nil, nil
	}
	if val.Kind == yaml3.AliasNode {
		*why = append(*why, name+" is an alias (*): an edit there would change what it points to")
		if val.Alias == nil {
			return nil, fmt.Errorf("%s is an alias to nothing", name)
		}
		val = val.Alias
	}
	if val.Anchor != "" {
		*why = append(*why, name+" carries an anchor (&): an edit there would change every alias of it too")
	}
	return val, nil
}

// place finds the pin's bytes in the file: the config literal block's
// lines are the file's lines below its indicator, less their indentation,
// so the value's line and column in config (yaml.v3 counts columns in
// characters) lead to its bytes, which must read exactly as the value
// written plain or quoted. It returns why not, when they do not.
func place(data []byte, config, val *yaml3.Node, loc *location) []string {
	lost := []string{"the bytes of " + pinKey + " could not be told apart in the file (escapes, or a layout pin does not edit)"}
	inner := strings.Split(config.Value, "\n")
	if val.Line < 1 || val.Line > len(inner) || val.Column < 1 {
		return lost
	}
	innerLine := inner[val.Line-1]
	lineNo := config.Line + val.Line // the content starts on the line after the indicator
	start, end := lineBounds(data, lineNo)
	if start < 0 {
		return lost
	}
	outerLine := strings.TrimSuffix(string(data[start:end]), "\r")
	indent := len(outerLine) - len(innerLine)
	if indent <= 0 || !strings.HasSuffix(outerLine, innerLine) || strings.Trim(outerLine[:indent], " ") != "" {
		return lost
	}
	off, col := 0, 1
	for col < val.Column && off < len(innerLine) {
		_, size := utf8.DecodeRuneInString(innerLine[off:])
		off += size
		col++
	}
	if col != val.Column {
		return lost
	}
	raw := innerLine[off:]
	quote := ""
	switch {
	case val.Style&yaml3.SingleQuotedStyle != 0:
		quote = "'"
	case val.Style&yaml3.DoubleQuotedStyle != 0:
		quote = `"`
	}
	if !strings.HasPrefix(raw, quote+val.Value+quote) {
		if rest := strings.TrimRight(raw, " \t"); rest != "" && strings.HasPrefix(quote+val.Value, rest) {
			return []string{pinKey + " spans several lines"} // the line ends inside the value
		}
		return lost
	}
	if quote == "" {
		// A plain scalar ends at the line's end, or before a comment.
		if rest := raw[len(val.Value):]; rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			return lost
		}
	}
	loc.lineStart = start
	loc.line = lineNo
	loc.start = start + indent + off + len(quote)
	loc.end = loc.start + len(val.Value)
	return nil
}

// lineBounds is the byte range of line n (1-based) of data, without its
// line feed; -1 when there is no such line.
func lineBounds(data []byte, n int) (int, int) {
	start := 0
	for i := 1; i < n; i++ {
		j := bytes.IndexByte(data[start:], '\n')
		if j < 0 {
			return -1, -1
		}
		start += j + 1
	}
	end := len(data)
	if j := bytes.IndexByte(data[start:], '\n'); j >= 0 {
		end = start + j
	}
	return start, end
}

// Edit sets the pin of a cloud-config's bytes to v: the value's
// characters replaced in place, every other byte as it was, and the
// result checked by parsing it again.
func Edit(data []byte, v version.Version) ([]byte, error) {
	loc, has, err := locate(data)
	switch {
	case err != nil:
		return nil, &Refusal{Reason: err.Error()}
	case !has:
		return nil, refuse("the cloud-config does not set the cluster: section's config")
	case loc.editErr != nil:
		return nil, &Refusal{Reason: loc.editErr.Error()}
	}
	return edit(data, loc, v)
}

func edit(data []byte, loc location, v version.Version) ([]byte, error) {
	out := make([]byte, 0, len(data)+len(v.String()))
	out = append(append(append(out, data[:loc.start]...), v.String()...), data[loc.end:]...)
	if err := check(data, out, v); err != nil {
		return nil, refuse("the edited file does not read back as the same file with the new pin (%v): nothing changed", err)
	}
	return out, nil
}

// check parses the edited file again: its pin reads v (and the plugin's
// parser reads no other: locate), and it decodes to what the original
// decodes to but for the pin (the cloud-config with config set aside, and
// config with the pin set aside).
func check(old, out []byte, v version.Version) error {
	loc, has, err := locate(out)
	if err != nil || !has || loc.editErr != nil || loc.value != v.String() {
		return fmt.Errorf("its pin does not read %s", v)
	}
	var o, n any
	if yaml3.Unmarshal(old, &o) != nil || yaml3.Unmarshal(out, &n) != nil {
		return errors.New("it does not parse")
	}
	oc, _ := child(child(o, "cluster"), "config").(string)
	nc, _ := child(child(n, "cluster"), "config").(string)
	setChild(child(o, "cluster"), "config", nil)
	setChild(child(n, "cluster"), "config", nil)
	if !reflect.DeepEqual(o, n) {
		return errors.New("a key besides the pin differs")
	}
	var oi, ni any
	if yaml3.Unmarshal([]byte(oc), &oi) != nil || yaml3.Unmarshal([]byte(nc), &ni) != nil {
		return errors.New("its config does not parse")
	}
	setChild(child(oi, "clusterConfiguration"), "kubernetesVersion", nil)
	setChild(child(ni, "clusterConfiguration"), "kubernetesVersion", nil)
	if !reflect.DeepEqual(oi, ni) {
		return errors.New("a kubeadm setting besides the pin differs")
	}
	return nil
}

// pluginPin is the pin as the plugin reads the section (clusterconfig).
func pluginPin(b []byte) (string, bool) {
	c, _, err := clusterconfig.ParseCloudConfig(b)
	if err != nil || c == nil {
		return "", false
	}
	k, err := c.Kubeadm()
	if err != nil {
		return "", false
	}
	p, err := k.Pin()
	return p, err == nil
}

func child(v any, key string) any {
	switch m := v.(type) {
	case map[string]any:
		return m[key]
	case map[any]any:
		return m[key]
	}
	return nil
}

func setChild(v any, key string, x any) {
	switch m := v.(type) {
	case map[string]any:
		m[key] = x
	case map[any]any:
		m[key] = x
	}
}

// Change is what Set did, or would do.
type Change struct {
	Path string
	// From is the pin as it was written (print it with plan.ShownPin).
	From string
	To   version.Version
	// Changed: the file was replaced (false: already at To, or a dry run).
	Changed bool
	// Diff is the change as a unified diff of the one line.
	Diff string
}

// Set sets the pin below root to v (a version Target accepted). With
// dryRun it changes nothing and says what it would change. A refusal
// (ErrRefused) leaves the file as it was.
func Set(root paths.Root, v version.Version, dryRun bool) (Change, error) {
	f, err := Find(root)
	if err != nil {
		return Change{}, err
	}
	defer f.Close()
	return f.set(v, dryRun)
}

// set is Set on the file Find held.
func (f *File) set(v version.Version, dryRun bool) (Change, error) {
	ch := Change{Path: f.Path, From: f.Pin, To: v}
	if f.Pin == v.String() {
		return ch, nil
	}
	if err := f.safe(); err != nil {
		return ch, err
	}
	out, err := edit(f.data, f.loc, v)
	if err != nil {
		return ch, fmt.Errorf("%s: %w", f.Path, err)
	}
	ch.Diff = f.diff(v)
	if dryRun {
		return ch, nil
	}
	dfd := int(f.dir.Fd())
	if err := unix.Flock(dfd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return ch, refuse("another pin set is writing in %s: run it again once it is done", path.Dir(f.Path))
		}
		return ch, &os.PathError{Op: "flock", Path: path.Dir(f.Path), Err: err}
	}
	defer unix.Flock(dfd, unix.LOCK_UN) //nolint:errcheck
	var now unix.Stat_t
	if err := unix.Fstatat(dfd, f.name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return ch, &os.PathError{Op: "lstat", Path: f.Path, Err: err}
	}
	if now.Dev != f.st.Dev || now.Ino != f.st.Ino || now.Size != f.st.Size || now.Mtim != f.st.Mtim || now.Ctim != f.st.Ctim {
		return ch, refuse("%s changed while pin was reading it: nothing written; run it again", f.Path)
	}
	if err := fsutil.WriteFileAtomicAtGroup(f.dir, f.name, out, os.FileMode(f.st.Mode&0o777), int(f.st.Gid)); err != nil {
		return ch, err
	}
	ch.Changed = true
	return ch, nil
}

// safe refuses a file that cannot be replaced without changing who can
// read or write it, or that someone else could change under pin.
func (f *File) safe() error {
	mode := f.st.Mode & 0o7777
	switch {
	case f.loc.editErr != nil:
		return refuse("%s: %v", f.Path, f.loc.editErr)
	case f.openDir != "":
		return refuse("%s can be written by another user (owner, or group or world write): whoever can write it could swap %s between pin's check and its write", f.openDir, f.Path)
	case f.st.Nlink != 1:
		return refuse("%s has %d hard links: replacing it would split it from its other names, writing in place would write into them", f.Path, f.st.Nlink)
	case int(f.st.Uid) != os.Geteuid():
		return refuse("%s is owned by uid %d, not this user (uid %d): pin does not rewrite a file someone else owns", f.Path, f.st.Uid, os.Geteuid())
	case mode&0o022 != 0:
		return refuse("%s is writable by its group or others (mode %04o): someone else could change it under pin; tighten its mode (chmod go-w) first", f.Path, mode)
	case mode&0o7000 != 0:
		return refuse("%s has setuid, setgid or sticky bits (mode %04o): pin does not rewrite it", f.Path, mode)
	}
	return nil
}

// diff is the change as a unified diff of its one line; a pin that is not
// a version is described, not shown.
func (f *File) diff(v version.Version) string {
	_, end := lineBounds(f.data, f.loc.line)
	line := strings.TrimSuffix(string(f.data[f.loc.lineStart:end]), "\r")
	pre, post := line[:f.loc.start-f.loc.lineStart], line[f.loc.end-f.loc.lineStart:]
	return fmt.Sprintf("--- %s\n+++ %s\n@@ -%d +%d @@\n-%s%s%s\n+%s%s%s\n", f.Path, f.Path, f.loc.line, f.loc.line,
		pre, plan.ShownPin(f.Pin), post, pre, v, post)
}
