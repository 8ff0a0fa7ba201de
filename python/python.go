// Package python carries elasticd's Python package (python/elasticd) inside the binary, so
// that a worker launched by elasticd can `import elasticd` on a host where nothing was
// installed: the launcher writes the package out once and puts it on the worker's PYTHONPATH.
package python

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Explicit patterns rather than the directory: a directory pattern leaves out files whose
// names begin with _ (__init__.py) and would take in __pycache__.
//
//go:embed elasticd/*.py elasticd/*/*.py
var files embed.FS

// Install writes the package under dir, in a directory named by a hash of its content (so a
// newer binary never uses an older copy, and an existing copy is reused), and returns the
// directory to put on PYTHONPATH.
func Install(dir string) (string, error) {
	h := sha256.New()
	var paths []string
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
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
	if err != nil {
		return "", err
	}
	root := filepath.Join(dir, "python-"+hex.EncodeToString(h.Sum(nil))[:16])
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
