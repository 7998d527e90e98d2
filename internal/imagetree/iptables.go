package imagetree

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/oci"
)

// The kube-proxy image needs iptables (iptables mode runs iptables,
// iptables-save, iptables-restore and their ip6 twins). They are taken from
// the build host's Debian iptables package (nft backend): xtables-nft-multi,
// the shared libraries it and its extensions need (found from the ELF
// headers, no ldd), the dynamic loader, and the extensions.

const xtablesMulti = "/usr/sbin/xtables-nft-multi"

var xtablesNames = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore"}

func multiarch() string {
	switch runtime.GOARCH {
	case "arm64":
		return "aarch64-linux-gnu"
	default:
		return "x86_64-linux-gnu"
	}
}

func libDirs() []string {
	m := multiarch()
	return []string{"/lib/" + m, "/usr/lib/" + m, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

// iptablesEntries returns the layer entries for iptables, read under hostRoot.
func iptablesEntries(hostRoot string) ([]oci.Entry, error) {
	host := func(p string) string { return filepath.Join(hostRoot, p) }
	if st, err := os.Stat(host(xtablesMulti)); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s not found under %s: the kube-proxy image takes iptables from the build host (apt-get install iptables): %v", xtablesMulti, hostRoot, err)
	}
	files := map[string]bool{xtablesMulti: true} // in-image path == host path
	extDir := "/usr/lib/" + multiarch() + "/xtables"
	exts, err := os.ReadDir(host(extDir))
	if err != nil {
		return nil, fmt.Errorf("iptables extensions: %w", err)
	}
	queue := []string{xtablesMulti}
	for _, e := range exts {
		if strings.HasSuffix(e.Name(), ".so") {
			p := path.Join(extDir, e.Name())
			files[p] = true
			queue = append(queue, p)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		needed, interp, err := elfNeeds(host(p))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if strings.HasPrefix(interp, "/lib/") {
			interp = "/usr" + interp // merged /usr: reached through the /lib link
		}
		if interp != "" {
			files[interp] = true
		}
		for _, lib := range needed {
			lp, err := findLib(hostRoot, lib)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: %w", p, lib, err)
			}
			if !files[lp] {
				files[lp] = true
				queue = append(queue, lp)
			}
		}
	}
	var out []oci.Entry
	for p := range files {
		// Symlinked library names are copied as regular files with the target's content.
		real, err := filepath.EvalSymlinks(host(p))
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(real)
		if err != nil {
			return nil, err
		}
		out = append(out, oci.Entry{Path: p, Source: real, Mode: st.Mode().Perm() & 0o755})
	}
	for _, n := range xtablesNames {
		out = append(out, oci.Entry{Path: "/usr/sbin/" + n, Type: tar.TypeSymlink, Linkname: "xtables-nft-multi"})
	}
	for _, f := range []string{"/etc/ethertypes", "/etc/protocols", "/etc/services"} {
		if st, err := os.Stat(host(f)); err == nil && st.Mode().IsRegular() {
			out = append(out, oci.Entry{Path: f, Source: host(f), Mode: 0o644})
		}
	}
	// Merged /usr: the loader's default search path includes /lib/<multiarch>.
	out = append(out, oci.Entry{Path: "/lib", Type: tar.TypeSymlink, Linkname: "usr/lib"})
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// elfNeeds returns an ELF file's DT_NEEDED libraries and its interpreter.
func elfNeeds(p string) ([]string, string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, "", err
	}
	interp := ""
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return nil, "", err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	return libs, interp, nil
}

// findLib resolves a library name in the standard directories; the in-image
// path is the one under /usr/lib/<multiarch> (merged /usr), or /lib64 for the loader.
func findLib(hostRoot, name string) (string, error) {
	for _, d := range libDirs() {
		p := path.Join(d, name)
		if st, err := os.Stat(filepath.Join(hostRoot, p)); err == nil && st.Mode().IsRegular() {
			if strings.HasPrefix(d, "/lib/") {
				p = path.Join("/usr", p)
			}
			return p, nil
		}
	}
	return "", errors.New("not found in " + strings.Join(libDirs(), ", "))
}
