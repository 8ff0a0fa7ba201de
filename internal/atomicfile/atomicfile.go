// Package atomicfile writes files that a crash leaves either whole or untouched: the bytes go
// to a temporary file in the same directory, are synced, and the file is renamed over the
// target, whose directory is then synced so that the rename itself survives a power loss.
// The driver's state file (--state-dir) and the workers' checkpoints use it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile writes data to path atomically with permissions perm. The temporary file is named
// after prefix (".tmp-<prefix>*") so that readers listing the directory can skip it; it is
// removed when anything fails.
func WriteFile(path string, data []byte, perm os.FileMode, prefix string) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".tmp-"+prefix+"*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
