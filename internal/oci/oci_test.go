package oci

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testImage(t *testing.T) Image {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("#!/bin/true\nbinary"), 0o700); err != nil {
		t.Fatal(err)
	}
	return Image{
		Ref:    "registry.k8s.io/etcd:3.7.0-0",
		Config: Config{Env: []string{"PATH=/usr/local/bin:/usr/bin"}, Entrypoint: []string{"/usr/local/bin/etcd"}},
		Entries: []Entry{
			{Path: "usr/local/bin/etcd", Source: src, Mode: 0o755},
			{Path: "var/lib/etcd", Type: tar.TypeDir, Mode: 0o700},
			{Path: "etc/hosts", Data: []byte("127.0.0.1 localhost\n")},
			{Path: "usr/sbin/iptables", Type: tar.TypeSymlink, Linkname: "xtables-nft-multi"},
		},
	}
}

func TestWriteInspectExtract(t *testing.T) {
	dir := t.TempDir()
	img := testImage(t)
	p := filepath.Join(dir, "etcd.tar")
	w, err := WriteFile(p, img)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	d, n, err := FileDigest(f)
	f.Close()
	if err != nil || d != w.SHA256 || n != w.Size {
		t.Fatalf("digest %s/%d, written %s/%d: %v", d, n, w.SHA256, w.Size, err)
	}
	info, err := Inspect(p)
	if err != nil {
		t.Fatal(err)
	}
	if info.Ref.Name != img.Ref || info.Ref.ManifestDigest != w.ManifestDigest || info.Config.Env[0] != img.Config.Env[0] ||
		info.Config.Entrypoint[0] != "/usr/local/bin/etcd" || info.Layers[0] != w.LayerDigest {
		t.Fatalf("%+v", info)
	}
	for path, mode := range map[string]int64{"usr": 0o755, "usr/local/bin": 0o755, "usr/local/bin/etcd": 0o755, "var/lib/etcd": 0o700, "etc/hosts": 0o644} {
		h, ok := info.Files[path]
		if !ok || h.Mode != mode || h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: %+v", path, h)
		}
	}
	if h := info.Files["usr/sbin/iptables"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "xtables-nft-multi" {
		t.Errorf("symlink: %+v", h)
	}
	out := filepath.Join(dir, "etcd-out")
	if err := Extract(p, "/usr/local/bin/etcd", out); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, []byte("#!/bin/true\nbinary")) {
		t.Fatalf("extracted %q", b)
	}
	// Reproducible: same inputs, same bytes.
	w2, err := WriteFile(filepath.Join(dir, "again.tar"), img)
	if err != nil || w2.SHA256 != w.SHA256 {
		t.Fatalf("not reproducible: %s vs %s (%v)", w2.SHA256, w.SHA256, err)
	}
	// No temporary layer left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Fatalf("left behind: %v", ents)
	}
}

// A layer whose bytes no longer match its digest: Extract refuses and
// leaves neither the file nor its .part behind.
func TestExtractRefusesATamperedLayer(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "etcd.tar")
	if _, err := WriteFile(p, testImage(t)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// The layer is stored uncompressed: same length, valid tars, other bytes.
	if bytes.Count(b, []byte("#!/bin/true\nbinary")) != 1 {
		t.Fatal("the file's content is not where the test expects it")
	}
	b = bytes.Replace(b, []byte("#!/bin/true\nbinary"), []byte("#!/bin/true\nBINARY"), 1)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "etcd-out")
	err = Extract(p, "/usr/local/bin/etcd", out)
	if err == nil || !strings.Contains(err.Error(), "layer digest") {
		t.Fatalf("Extract of a tampered layer: %v", err)
	}
	for _, f := range []string{out, out + ".part"} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", f, err)
		}
	}
}

func TestWriteRejects(t *testing.T) {
	dir := t.TempDir()
	for name, img := range map[string]Image{
		"no tag":         {Ref: "registry.k8s.io/pause"},
		"escape":         {Ref: "x/y:1", Entries: []Entry{{Path: "../etc/passwd", Data: []byte("x")}}},
		"duplicate":      {Ref: "x/y:1", Entries: []Entry{{Path: "a", Data: nil}, {Path: "/a", Data: nil}}},
		"file as parent": {Ref: "x/y:1", Entries: []Entry{{Path: "a", Data: nil}, {Path: "a/b", Data: nil}}},
	} {
		if _, err := WriteFile(filepath.Join(dir, "x.tar"), img); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ReadRef(bytes.NewReader([]byte("not a tar"))); err == nil {
		t.Error("ReadRef of garbage")
	}
}
