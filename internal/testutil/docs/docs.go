// Package docs reads the operator documentation in docs/ for tests: the
// commands a page shows are taken from the page's own text, so a changed
// flag or path in a page fails the test that runs it.
//
// # What a command is
//
// A command is a line of a ```sh fenced block that starts with "$ " or
// "sudo " (the prompt and sudo are dropped); a line ending in "\" is
// continued on the next. Other lines of the block (comments, output) are
// not commands.
//
// # Local and end-to-end commands
//
// A block whose fence is preceded (blank lines aside) by the line
//
//	<!-- e2e -->
//
// needs a live cluster: kubectl, etcdctl against a running control plane,
// kairos-agent upgrade, a reboot, systemd's journal. Its commands are
// E2ECommands, for the end-to-end suite (tests/e2e), which runs them as
// written inside a node. Every other command is local: LocalCommands.
//
// # How the local commands run (tests/docs)
//
// Every local command of a page is run by that page's test in tests/docs,
// exactly as the page shows it (sudo dropped): `sh -c LINE`, as root,
// chrooted into a sandbox node's root. Nothing is rewritten and no flag is
// added: the page's absolute paths (/var/log/..., /run/provider-kubernetes,
// /etc/kubernetes, /usr/bin/etcdctl) are the sandbox's. The sandbox is a
// private mount, network and UTS namespace: its /usr is the host's /usr
// with the image's binaries laid over it (an overlay: /usr/bin/provider-kubernetes
// linked to /system/providers/agent-provider-kubernetes as in the image,
// the bundled etcdctl and etcdutl), /usr/local is its own (empty) tmpfs,
// /proc is real, /sys the host's read-only, and 127.0.0.1 is the
// namespace's own loopback, where a real etcd answers on 2379 and a
// loopback HTTPS API (internal/testutil.API) plays the cluster when a
// page's command reads it. What the page's commands read (the reconcile
// log, the status document) was written there by the real provider binary
// (`provider-kubernetes reconcile`, `etcd-snapshot`, ...) before.
//
// A Page records which commands its test ran (Command); Unrun names the
// local commands no test ran, and the page test fails on them: a command
// added to a page without a test fails too. A ```text block right after a
// ```sh block is what the page says it prints (Block.Output, Page.Output):
// the tests compare it with what the command printed.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// E2EMarker is the line that marks the next ```sh block as needing a live
// cluster (run by the end-to-end suite, not tests/docs).
const E2EMarker = "<!-- e2e -->"

// Dir is the docs/ directory of this checkout.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "docs")
}

// Block is one ```sh block of a page.
type Block struct {
	Line     int      // the line of its opening fence, from 1
	E2E      bool     // marked with E2EMarker: needs a live cluster
	Commands []string // in order
	// Output is the ```text block that follows the block, with nothing but
	// prose between them: what the page says the commands print (the
	// fence's indentation and trailing spaces dropped); "" when there is
	// none.
	Output string
}

// Blocks returns the ```sh blocks of a page (a file name under docs/), in
// order, blocks without a command included.
func Blocks(page string) ([]Block, error) {
	return BlocksIn(filepath.Join(Dir(), page))
}

// BlocksIn returns the ```sh blocks of the markdown file at path.
func BlocksIn(path string) ([]Block, error) {
	page := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Block
	var cur *Block
	// other is the opening line of a fenced block of another language;
	// output collects a ```text block that directly follows a ```sh one.
	other, output, afterSh, indent := 0, (*[]string)(nil), false, 0
	var text []string
	cont, prev, n := "", "", 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		t := strings.TrimSpace(sc.Text())
		switch {
		case other > 0:
			if t == "```" {
				if output != nil {
					out[len(out)-1].Output = strings.Join(*output, "\n") + "\n"
				}
				other, output, prev = 0, nil, t
			} else if output != nil {
				l := strings.TrimRight(sc.Text(), " \t")
				for i := 0; i < indent && strings.HasPrefix(l, " "); i++ {
					l = l[1:]
				}
				*output = append(*output, l)
			}
			continue
		case cur == nil && strings.HasPrefix(t, "```sh"):
			cur = &Block{Line: n, E2E: prev == E2EMarker}
			continue
		case cur == nil && strings.HasPrefix(t, "```"):
			other = n
			if t == "```text" && afterSh {
				text = text[:0]
				output = &text
				indent = len(sc.Text()) - len(strings.TrimLeft(sc.Text(), " "))
			}
			afterSh = false
			continue
		case cur != nil && t == "```":
			if cont != "" {
				return nil, fmt.Errorf("%s:%d: a command continued past the end of its block", page, n)
			}
			out = append(out, *cur)
			cur, prev, afterSh = nil, t, true
			continue
		case cur == nil:
			if t != "" {
				prev = t
			}
			continue
		}
		if cont != "" {
			t = cont + " " + t
			cont = ""
		} else if s, ok := strings.CutPrefix(t, "$ "); ok {
			t = s
		} else if !strings.HasPrefix(t, "sudo ") {
			continue
		}
		t = strings.TrimPrefix(t, "sudo ")
		if s, ok := strings.CutSuffix(t, "\\"); ok {
			cont = strings.TrimSpace(s)
			continue
		}
		cur.Commands = append(cur.Commands, t)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```sh block is not closed", page, cur.Line)
	}
	if other > 0 {
		return nil, fmt.Errorf("%s:%d: a fenced block is not closed", page, other)
	}
	return out, nil
}

// Commands returns the commands of a page (a file name under docs/), in
// order, local and end-to-end alike.
func Commands(page string) ([]string, error) {
	return CommandsIn(filepath.Join(Dir(), page))
}

// CommandsIn returns the commands of the markdown file at path.
func CommandsIn(path string) ([]string, error) {
	return commandsIn(path, func(Block) bool { return true })
}

// LocalCommands returns the commands of a page that need no cluster: those
// of blocks not marked E2EMarker.
func LocalCommands(page string) ([]string, error) {
	return commandsIn(filepath.Join(Dir(), page), func(b Block) bool { return !b.E2E })
}

// E2ECommands returns the commands of a page's blocks marked E2EMarker:
// the ones only the end-to-end suite can run, on a node of a live cluster.
func E2ECommands(page string) ([]string, error) {
	return commandsIn(filepath.Join(Dir(), page), func(b Block) bool { return b.E2E })
}

func commandsIn(path string, keep func(Block) bool) ([]string, error) {
	blocks, err := BlocksIn(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range blocks {
		if keep(b) {
			out = append(out, b.Commands...)
		}
	}
	return out, nil
}

// Command returns the one command of page that starts with prefix: a test
// runs exactly what the page tells operators to run.
func Command(page, prefix string) (string, error) {
	cmds, err := Commands(page)
	if err != nil {
		return "", err
	}
	var found []string
	for _, c := range cmds {
		if strings.HasPrefix(c, prefix) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("docs/%s shows %d commands starting with %q, want 1 (commands: %q)", page, len(found), prefix, cmds)
	}
	return found[0], nil
}

// Page is a page's commands with a record of which ones a test took.
type Page struct {
	Name   string
	blocks []Block
	local  []string
	e2e    []string
	mu     sync.Mutex
	ran    map[string]bool
}

// Open reads a page (a file name under docs/).
func Open(page string) (*Page, error) {
	return OpenAt(filepath.Join(Dir(), page))
}

// OpenAt reads the markdown file at path.
func OpenAt(path string) (*Page, error) {
	blocks, err := BlocksIn(path)
	if err != nil {
		return nil, err
	}
	p := &Page{Name: filepath.Base(path), blocks: blocks, ran: map[string]bool{}}
	for _, b := range blocks {
		if b.E2E {
			p.e2e = append(p.e2e, b.Commands...)
		} else {
			p.local = append(p.local, b.Commands...)
		}
	}
	return p, nil
}

// Local returns the page's local commands, in order.
func (p *Page) Local() []string { return append([]string(nil), p.local...) }

// E2E returns the page's end-to-end commands, in order.
func (p *Page) E2E() []string { return append([]string(nil), p.e2e...) }

// Command selects one local command by prefix and records it as run: the
// command that is exactly prefix, or else the only one that starts with
// it (a command shown twice, identically, counts once). An end-to-end
// command is never selected: a test here cannot run it.
func (p *Page) Command(prefix string) (string, error) {
	return p.pick("local", p.local, prefix)
}

// E2ECommand selects one end-to-end command by prefix, as Command does
// for local ones, and records it as run: the end-to-end suite runs it in a
// node of a live cluster.
func (p *Page) E2ECommand(prefix string) (string, error) {
	return p.pick("end-to-end", p.e2e, prefix)
}

// pick is Command and E2ECommand over one kind of the page's commands.
func (p *Page) pick(kind string, cmds []string, prefix string) (string, error) {
	var exact, starts []string
	for _, c := range uniq(cmds) {
		switch {
		case c == prefix:
			exact = append(exact, c)
		case strings.HasPrefix(c, prefix):
			starts = append(starts, c)
		}
	}
	found := exact
	if len(found) == 0 {
		found = starts
	}
	if len(found) != 1 {
		return "", fmt.Errorf("docs/%s shows %d %s commands that are or start with %q, want 1 (%s commands: %q)", p.Name, len(found), kind, prefix, kind, cmds)
	}
	p.mu.Lock()
	p.ran[found[0]] = true
	p.mu.Unlock()
	return found[0], nil
}

// Unrun returns the local commands no Command call selected, in order.
func (p *Page) Unrun() []string { return p.unrun(p.local) }

// UnrunE2E returns the end-to-end commands no E2ECommand call selected, in order.
func (p *Page) UnrunE2E() []string { return p.unrun(p.e2e) }

func (p *Page) unrun(cmds []string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, c := range uniq(cmds) {
		if !p.ran[c] {
			out = append(out, c)
		}
	}
	return out
}

// Output returns what the page shows the block of command cmd (as
// Command returned it) printing: its Output, "" when it shows none.
func (p *Page) Output(cmd string) string {
	for _, b := range p.blocks {
		for _, c := range b.Commands {
			if c == cmd {
				return b.Output
			}
		}
	}
	return ""
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range in {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// Pages returns the markdown pages under docs/, sorted.
func Pages() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(Dir(), "*.md"))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(m))
	for i, p := range m {
		out[i] = filepath.Base(p)
	}
	sort.Strings(out)
	return out, nil
}

// TableRow returns the cells of the one table row of page (a file name
// under docs/) whose first cell is name in backticks, each trimmed: a test
// in a package reads the value it checks (a file's mode, a default) from
// the page that promises it.
func TableRow(page, name string) ([]string, error) {
	return TableRowIn(filepath.Join(Dir(), page), name)
}

// TableRowIn is TableRow of the markdown file at path.
func TableRowIn(path, name string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var found [][]string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "| `"+name+"` |") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		found = append(found, cells)
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%s has %d table rows for `%s`, want 1", filepath.Base(path), len(found), name)
	}
	return found[0], nil
}

// FileMode is the mode docs/reference.md's Files table gives the host
// path p (every file there is root:root, the page says).
func FileMode(p string) (os.FileMode, error) {
	row, err := TableRow("reference.md", p)
	if err != nil {
		return 0, err
	}
	if len(row) < 3 {
		return 0, fmt.Errorf("reference.md's row for %s has %d cells", p, len(row))
	}
	m, err := strconv.ParseUint(row[1], 8, 32)
	if err != nil || !strings.HasPrefix(row[1], "0") {
		return 0, fmt.Errorf("reference.md gives %s the mode %q, not an octal mode", p, row[1])
	}
	return os.FileMode(m), nil
}
