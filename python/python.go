// Package python carries elasticd's Python package (python/elasticd) inside the binary, so
// that a worker launched by elasticd can `import elasticd` on a host where nothing was
// installed: the launcher writes the package out once and puts it on the worker's PYTHONPATH.
package python

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Explicit patterns rather than the directory: a directory pattern leaves out files whose
// names begin with _ (__init__.py) and would take in __pycache__.
//
//go:embed elasticd/*.py elasticd/*/*.py
var files embed.FS

// contents lists the package's files and names the directory a copy of them goes in: a hash
// of their content, so a newer binary never uses an older copy and an existing one is reused.
func contents() (name string, paths []string, err error) {
	h := sha256.New()
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		paths = append(paths, p)
		return nil
	})
	return "python-" + hex.EncodeToString(h.Sum(nil))[:16], paths, err
}

// Install writes the package under dir, in a directory named by a hash of its content, and
// returns the directory to put on PYTHONPATH.
func Install(dir string) (string, error) {
	name, paths, err := contents()
	if err != nil {
		return "", err
	}
	root := filepath.Join(dir, name)
	if _, err := os.Stat(filepath.Join(root, "elasticd", "__init__.py")); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install the Python package: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".python-*")
	if err != nil {
		return "", fmt.Errorf("install the Python package: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, p := range paths {
		b, _ := files.ReadFile(p)
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", fmt.Errorf("install the Python package: %w", err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return "", fmt.Errorf("install the Python package: %w", err)
		}
	}
	os.Chmod(tmp, 0o755)
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(filepath.Join(root, "elasticd", "__init__.py")); serr == nil {
			return root, nil // another process installed the same content first
		}
		return "", fmt.Errorf("install the Python package: %w", err)
	}
	return root, nil
}

// Env returns the PYTHONPATH entry that puts the package at root ahead of current (the
// PYTHONPATH the worker would otherwise get, possibly empty).
func Env(root, current string) string {
	if current == "" {
		return "PYTHONPATH=" + root
	}
	return "PYTHONPATH=" + root + string(os.PathListSeparator) + strings.TrimPrefix(current, string(os.PathListSeparator))
}

// CacheDir is where Install puts the package by default: the user's cache directory, else the
// temporary directory.
func CacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "elasticd")
	}
	return filepath.Join(os.TempDir(), "elasticd-cache")
}

// RemoteInstall is a POSIX sh snippet that does on another host what Install and Env do here,
// for launchers that reach it with a shell only (ssh): it writes the package, carried inside
// the snippet as a base64 tar.gz, under $ELASTICD_CACHE_DIR, else $XDG_CACHE_HOME/elasticd,
// else ~/.cache/elasticd (skipped when that copy exists), and puts it ahead of PYTHONPATH. It
// needs base64, tar and gzip there; when it cannot write, it says so and the worker starts
// without the package. Its variables start with __ep_.
func RemoteInstall() (string, error) {
	name, paths, err := contents()
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	for _, p := range paths {
		for d := path.Dir(p); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	slices.Sort(sorted) // parents first
	for _, d := range sorted {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
			return "", err
		}
	}
	for _, p := range paths {
		b, _ := files.ReadFile(p)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return "", err
		}
		tw.Write(b)
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	zw.Close()
	enc := base64.StdEncoding.EncodeToString(buf.Bytes())
	var b strings.Builder
	fmt.Fprintf(&b, "__ep_d=${ELASTICD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticd}/%s\n", name)
	b.WriteString(`if [ ! -f "$__ep_d/elasticd/__init__.py" ]; then
	if mkdir -p "${__ep_d%/*}" && __ep_t=$(mktemp -d "$__ep_d.XXXXXX") && base64 -d <<'__ELASTICD_PYTHON__' | tar -xzf - -C "$__ep_t" && chmod 755 "$__ep_t"; then
`)
	for len(enc) > 0 {
		n := min(76, len(enc))
		b.WriteString(enc[:n] + "\n")
		enc = enc[n:]
	}
	b.WriteString(`__ELASTICD_PYTHON__
		mv -T "$__ep_t" "$__ep_d" 2>/dev/null || rm -rf "$__ep_t" # another worker wrote it first
	else
		echo "elasticd: could not write the Python package to $__ep_d (base64, tar and gzip are needed): the worker cannot import elasticd" >&2
		[ -n "$__ep_t" ] && rm -rf "$__ep_t"
	fi
fi
[ -f "$__ep_d/elasticd/__init__.py" ] && export PYTHONPATH="$__ep_d${PYTHONPATH:+:$PYTHONPATH}"
`)
	return b.String(), nil
}
