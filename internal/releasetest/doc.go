// Package releasetest holds the test of scripts/release.sh (make release): it builds the amd64
// tarball as a release would and checks what is inside. It has no code of its own.
package releasetest
