//go:build race

package aws_test

// raceDetector: the race detector makes XML decoding ~10× slower; the largest groups are left
// to the normal build.
const raceDetector = true
