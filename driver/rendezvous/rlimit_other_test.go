//go:build !unix

package rendezvous_test

func raiseFileLimit(uint64) error { return nil }
