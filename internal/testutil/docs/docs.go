// Package docs reads the operator documentation in docs/ for tests: the
// commands a page shows are taken from the page's own text, so a changed
// flag or path in a page fails the test that runs it.
//
// A command is a line of a ```sh fenced block that starts with "$ " or
// "sudo " (the prompt and sudo are dropped); a line ending in "\" is
// continued on the next. Other lines of the block (comments, output) are
// not commands.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Dir is the docs/ directory of this checkout.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "docs")
}

// Commands returns the commands of a page (a file name under docs/), in
// order.
func Commands(page string) ([]string, error) {
	return CommandsIn(filepath.Join(Dir(), page))
}

// CommandsIn returns the commands of the markdown file at path.
func CommandsIn(path string) ([]string, error) {
	page := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	in, cont := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		t := strings.TrimSpace(l)
		switch {
		case !in && strings.HasPrefix(t, "```sh"):
			in = true
			continue
		case in && t == "```":
			in = false
			if cont != "" {
				return nil, fmt.Errorf("%s: a command continued past the end of its block", page)
			}
			continue
		case !in:
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
		out = append(out, t)
	}
	return out, sc.Err()
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
