// Package oci writes single-layer OCI image layout tarballs with no
// registry and no container tooling: what `ctr images import` takes, named
// by the exact reference in the index's io.containerd.image.name annotation.
// Output is reproducible: the same entries and config give the same bytes
// (sorted entries, zero mtimes, uid/gid 0).
package oci

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Media types.
const (
	MediaManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaConfig   = "application/vnd.oci.image.config.v1+json"
	MediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	// AnnotationName is the annotation containerd names an imported image by.
	AnnotationName = "io.containerd.image.name"
	// AnnotationRefName is the OCI tag annotation.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// Entry is one file, directory or symlink of the layer.
type Entry struct {
	Path     string      // slash-separated, relative to the image root ("usr/local/bin/etcd")
	Type     byte        // tar.TypeReg (default), tar.TypeDir or tar.TypeSymlink
	Mode     fs.FileMode // permission bits (0755 default for dirs, 0644 for files)
	Source   string      // TypeReg: a file on disk to copy, or
	Data     []byte      // TypeReg: inline content
	Linkname string      // TypeSymlink: the target
}

// Config is the part of the image config a runtime uses.
type Config struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
}

// Image is one image to write.
type Image struct {
	Ref     string // the exact reference, e.g. registry.k8s.io/pause:3.10.2
	Config  Config
	Entries []Entry
	Arch    string // default runtime.GOARCH
}

// Written describes a written tarball.
type Written struct {
	ManifestDigest string // sha256:...
	ConfigDigest   string
	LayerDigest    string
	SHA256         string // hex digest of the tarball itself
	Size           int64  // of the tarball
}

// Tag is the tag part of a reference ("v1.37.2" of registry.k8s.io/kube-apiserver:v1.37.2).
func Tag(ref string) string {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}

// WriteFile writes the image to path (through a unique part file, renamed
// when complete) and returns its digests. Temporary layer data goes next to path.
func WriteFile(p string, img Image) (Written, error) {
	// A unique part file: two builders may write the same cached image at once.
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".part-*")
	if err != nil {
		return Written{}, err
	}
	part := f.Name()
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		os.Remove(part)
		return Written{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	w, err := Write(cw, filepath.Dir(p), img)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(part)
		return Written{}, err
	}
	w.SHA256, w.Size = hex.EncodeToString(h.Sum(nil)), cw.n
	if err := os.Rename(part, p); err != nil {
		os.Remove(part)
		return Written{}, err
	}
	return w, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Write streams the image as an OCI layout tarball to w; tmpDir holds the
// layer while its digest is computed.
func Write(w io.Writer, tmpDir string, img Image) (Written, error) {
	if img.Ref == "" || Tag(img.Ref) == "" {
		return Written{}, fmt.Errorf("image reference %q has no tag", img.Ref)
	}
	arch := img.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	layer, err := os.CreateTemp(tmpDir, ".layer-*.tar")
	if err != nil {
		return Written{}, err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	lh := sha256.New()
	lsize, err := writeLayer(io.MultiWriter(layer, lh), img.Entries)
	if err != nil {
		return Written{}, fmt.Errorf("layer of %s: %w", img.Ref, err)
	}
	layerDigest := "sha256:" + hex.EncodeToString(lh.Sum(nil))

	cfg, err := json.Marshal(struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       Config `json:"config"`
		RootFS       struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}{Architecture: arch, OS: "linux", Config: img.Config, RootFS: struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	}{"layers", []string{layerDigest}}})
	if err != nil {
		return Written{}, err
	}
	configDigest := digest(cfg)
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	manifest, err := json.Marshal(struct {
		SchemaVersion int    `json:"schemaVersion"`
		MediaType     string `json:"mediaType"`
		Config        desc   `json:"config"`
		Layers        []desc `json:"layers"`
	}{2, MediaManifest, desc{MediaType: MediaConfig, Digest: configDigest, Size: int64(len(cfg))},
		[]desc{{MediaType: MediaLayer, Digest: layerDigest, Size: lsize}}})
	if err != nil {
		return Written{}, err
	}
	manifestDigest := digest(manifest)
	index, err := json.Marshal(struct {
		SchemaVersion int    `json:"schemaVersion"`
		Manifests     []desc `json:"manifests"`
	}{2, []desc{{MediaType: MediaManifest, Digest: manifestDigest, Size: int64(len(manifest)),
		Annotations: map[string]string{AnnotationName: img.Ref, AnnotationRefName: Tag(img.Ref)}}}})
	if err != nil {
		return Written{}, err
	}

	tw := tar.NewWriter(w)
	addBytes := func(name string, b []byte) error {
		if err := tw.WriteHeader(fileHeader(name, int64(len(b)), 0o644)); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return Written{}, err
	}
	if err := addBytes("index.json", index); err != nil {
		return Written{}, err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(dirHeader(d, 0o755)); err != nil {
			return Written{}, err
		}
	}
	if err := addBytes(blobPath(configDigest), cfg); err != nil {
		return Written{}, err
	}
	if err := addBytes(blobPath(manifestDigest), manifest); err != nil {
		return Written{}, err
	}
	if err := tw.WriteHeader(fileHeader(blobPath(layerDigest), lsize, 0o644)); err != nil {
		return Written{}, err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return Written{}, err
	}
	if n, err := io.Copy(tw, layer); err != nil || n != lsize {
		return Written{}, fmt.Errorf("copy layer: %d of %d bytes: %v", n, lsize, err)
	}
	if err := tw.Close(); err != nil {
		return Written{}, err
	}
	return Written{ManifestDigest: manifestDigest, ConfigDigest: configDigest, LayerDigest: layerDigest}, nil
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

var epoch = time.Unix(0, 0)

func fileHeader(name string, size int64, mode fs.FileMode) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: int64(mode.Perm()), ModTime: epoch, Format: tar.FormatPAX}
}

func dirHeader(name string, mode fs.FileMode) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: int64(mode.Perm()), ModTime: epoch, Format: tar.FormatPAX}
}

// writeLayer writes the entries, with every missing parent directory, sorted.
func writeLayer(w io.Writer, entries []Entry) (int64, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		p := path.Clean(strings.TrimPrefix(e.Path, "/"))
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return 0, fmt.Errorf("entry path %q", e.Path)
		}
		if _, dup := byPath[p]; dup {
			return 0, fmt.Errorf("entry %s listed twice", p)
		}
		e.Path = p
		if e.Type == 0 {
			e.Type = tar.TypeReg
		}
		byPath[p] = e
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if prev, ok := byPath[d]; ok {
				if prev.Type != tar.TypeDir {
					return 0, fmt.Errorf("%s is both a parent directory and a %c entry", d, prev.Type)
				}
				continue
			}
			byPath[d] = Entry{Path: d, Type: tar.TypeDir}
		}
	}
	names := make([]string, 0, len(byPath))
	for p := range byPath {
		names = append(names, p)
	}
	sort.Strings(names)
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	for _, p := range names {
		e := byPath[p]
		switch e.Type {
		case tar.TypeDir:
			mode := e.Mode
			if mode == 0 {
				mode = 0o755
			}
			if err := tw.WriteHeader(dirHeader(p+"/", mode)); err != nil {
				return 0, err
			}
		case tar.TypeSymlink:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: e.Linkname, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return 0, err
			}
		case tar.TypeReg:
			mode := e.Mode
			if mode == 0 {
				mode = 0o644
			}
			if err := writeFileEntry(tw, p, mode, e); err != nil {
				return 0, err
			}
		default:
			return 0, fmt.Errorf("%s: unsupported entry type %c", p, e.Type)
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	return cw.n, nil
}

func writeFileEntry(tw *tar.Writer, p string, mode fs.FileMode, e Entry) error {
	if e.Source == "" {
		if err := tw.WriteHeader(fileHeader(p, int64(len(e.Data)), mode)); err != nil {
			return err
		}
		_, err := tw.Write(e.Data)
		return err
	}
	f, err := os.Open(e.Source)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", e.Source)
	}
	if err := tw.WriteHeader(fileHeader(p, st.Size(), mode)); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s changed while being read", e.Source)
	}
	return err
}

// Ref is what a tarball's index names.
type Ref struct {
	Name           string // io.containerd.image.name
	ManifestDigest string
}

// ErrNoIndex marks a tarball without a usable index.json.
var ErrNoIndex = errors.New("no OCI index with one named manifest")

// ReadRef reads the index.json of an OCI layout tarball and returns the one
// manifest it names. It reads at most maxIndex bytes of the index.
func ReadRef(r io.Reader) (Ref, error) {
	const maxIndex = 1 << 20
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return Ref{}, ErrNoIndex
		}
		if err != nil {
			return Ref{}, fmt.Errorf("read tarball: %w", err)
		}
		if path.Clean(h.Name) != "index.json" {
			continue
		}
		var b bytes.Buffer
		if _, err := io.Copy(&b, io.LimitReader(tr, maxIndex+1)); err != nil {
			return Ref{}, err
		}
		if b.Len() > maxIndex {
			return Ref{}, fmt.Errorf("%w: index.json larger than %d bytes", ErrNoIndex, maxIndex)
		}
		var idx struct {
			Manifests []struct {
				Digest      string            `json:"digest"`
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.Unmarshal(b.Bytes(), &idx); err != nil {
			return Ref{}, fmt.Errorf("%w: %v", ErrNoIndex, err)
		}
		if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations[AnnotationName] == "" {
			return Ref{}, fmt.Errorf("%w: %d manifests", ErrNoIndex, len(idx.Manifests))
		}
		return Ref{Name: idx.Manifests[0].Annotations[AnnotationName], ManifestDigest: idx.Manifests[0].Digest}, nil
	}
}

// FileDigest returns the hex sha256 of a reader's content.
func FileDigest(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hexSum(h), n, err
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// Info is what an OCI layout tarball holds.
type Info struct {
	Ref    Ref
	Arch   string
	Config Config
	Layers []string               // layer digests
	Files  map[string]*tar.Header // the single layer's entries by clean path
}

// Inspect reads an OCI layout tarball written by Write (or any
// single-manifest, uncompressed-layer layout): its name, config and files.
func Inspect(tarball string) (Info, error) {
	var info Info
	blobs, err := readBlobs(tarball, func(name string) bool { return true }, 4<<20)
	if err != nil {
		return info, err
	}
	f, err := os.Open(tarball)
	if err != nil {
		return info, err
	}
	defer f.Close()
	if info.Ref, err = ReadRef(f); err != nil {
		return info, err
	}
	mb, ok := blobs[blobPath(info.Ref.ManifestDigest)]
	if !ok || digest(mb) != info.Ref.ManifestDigest {
		return info, fmt.Errorf("manifest %s missing or corrupt", info.Ref.ManifestDigest)
	}
	var m struct {
		Config struct{ Digest string }              `json:"config"`
		Layers []struct{ Digest, MediaType string } `json:"layers"`
	}
	if err := json.Unmarshal(mb, &m); err != nil {
		return info, err
	}
	cb, ok := blobs[blobPath(m.Config.Digest)]
	if !ok || digest(cb) != m.Config.Digest {
		return info, fmt.Errorf("config %s missing or corrupt", m.Config.Digest)
	}
	var c struct {
		Architecture string `json:"architecture"`
		Config       Config `json:"config"`
	}
	if err := json.Unmarshal(cb, &c); err != nil {
		return info, err
	}
	info.Arch, info.Config = c.Architecture, c.Config
	for _, l := range m.Layers {
		if l.MediaType != MediaLayer {
			return info, fmt.Errorf("layer %s: media type %s not supported", l.Digest, l.MediaType)
		}
		info.Layers = append(info.Layers, l.Digest)
	}
	if len(info.Layers) != 1 {
		return info, fmt.Errorf("%d layers, want 1", len(info.Layers))
	}
	info.Files = map[string]*tar.Header{}
	err = eachInLayer(tarball, info.Layers[0], func(h *tar.Header, _ io.Reader) error {
		info.Files[path.Clean(h.Name)] = h
		return nil
	})
	return info, err
}

// Extract copies the regular file at inImage from the tarball's single
// layer to dst (mode 0755). dst appears only once the whole layer matched
// its digest: the copy goes to dst.part first and is removed otherwise.
func Extract(tarball, inImage, dst string) error {
	info, err := Inspect(tarball)
	if err != nil {
		return err
	}
	part := dst + ".part"
	_ = os.Remove(part)
	defer os.Remove(part) // gone after the rename; left only on failure
	want := path.Clean(strings.TrimPrefix(inImage, "/"))
	found := false
	err = eachInLayer(tarball, info.Layers[0], func(h *tar.Header, r io.Reader) error {
		if found || path.Clean(h.Name) != want || h.Typeflag != tar.TypeReg {
			return nil
		}
		out, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, r); err != nil {
			out.Close()
			return err
		}
		found = true
		return out.Close()
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%s: no regular file %s", tarball, inImage)
	}
	if err := os.Chmod(part, 0o755); err != nil { // exact mode whatever the umask
		return err
	}
	return os.Rename(part, dst)
}

// eachInLayer calls fn for every entry of the layer blob with the given
// digest, then checks the blob's digest: what fn did counts only when
// eachInLayer returns nil.
func eachInLayer(tarball, layerDigest string, fn func(h *tar.Header, r io.Reader) error) error {
	return withLayer(tarball, layerDigest, func(tr *tar.Reader) error {
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := fn(h, tr); err != nil {
				return err
			}
		}
	})
}

// withLayer runs fn over the layer blob with the given digest, checking the digest.
func withLayer(tarball, layerDigest string, fn func(*tar.Reader) error) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("layer %s not in %s", layerDigest, tarball)
		}
		if err != nil {
			return err
		}
		if path.Clean(h.Name) != blobPath(layerDigest) {
			continue
		}
		hs := sha256.New()
		if err := fn(tar.NewReader(io.TeeReader(tr, hs))); err != nil {
			return err
		}
		if _, err := io.Copy(hs, tr); err != nil {
			return err
		}
		if got := "sha256:" + hexSum(hs); got != layerDigest {
			return fmt.Errorf("layer digest %s, want %s", got, layerDigest)
		}
		return nil
	}
}

// readBlobs returns the small blobs (at most limit bytes each) by clean path.
func readBlobs(tarball string, want func(string) bool, limit int64) (map[string][]byte, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || h.Size > limit || !strings.HasPrefix(name, "blobs/sha256/") || !want(name) {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out[name] = b
	}
}
