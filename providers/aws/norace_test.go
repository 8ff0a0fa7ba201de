//go:build !race

package aws_test

const raceDetector = false
