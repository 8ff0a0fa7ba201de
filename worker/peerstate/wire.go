package peerstate

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Kind is the kind of a request.
type Kind uint8

// Request kinds.
const (
	KindManifest Kind = 1
	KindChunk    Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindManifest:
		return "manifest"
	case KindChunk:
		return "chunk"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Status is a holder's answer.
type Status uint8

// Reply statuses.
const (
	StatusOK         Status = 0
	StatusBusy       Status = 1
	StatusNoVersion  Status = 2
	StatusDenied     Status = 3
	StatusBadRequest Status = 4
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusBusy:
		return "busy"
	case StatusNoVersion:
		return "no such version"
	case StatusDenied:
		return "denied"
	case StatusBadRequest:
		return "bad request"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

const (
	magic         = "EPS1"
	requestLen    = 65
	macLen        = sha256.Size
	maxFrame      = 4 << 20
	reqMACContext = "elasticd peerstate request\x00"
	manMACContext = "elasticd peerstate manifest\x00"
	// MaxSize is the largest state a holder serves.
	MaxSize = 1 << 40
)

type request struct {
	kind    Kind
	version uint64
	chunk   uint32
	nonce   [16]byte
}

func mac(secret []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// appendRequest appends the request's frame.
func appendRequest(b []byte, secret []byte, r request) []byte {
	b = binary.BigEndian.AppendUint32(b, requestLen)
	start := len(b)
	b = append(b, magic...)
	b = append(b, byte(r.kind))
	b = binary.BigEndian.AppendUint64(b, r.version)
	b = binary.BigEndian.AppendUint32(b, r.chunk)
	b = append(b, r.nonce[:]...)
	return append(b, mac(secret, []byte(reqMACContext), b[start:])...)
}

var errBadMAC = errors.New("bad MAC: the request was not signed with this job's secret")

// parseRequest checks a request body (the frame without its length).
func parseRequest(secret, body []byte) (request, error) {
	if len(body) != requestLen || string(body[:4]) != magic {
		return request{}, fmt.Errorf("not a peerstate request (%d bytes)", len(body))
	}
	if !hmac.Equal(body[33:], mac(secret, []byte(reqMACContext), body[:33])) {
		return request{}, errBadMAC
	}
	r := request{kind: Kind(body[4]), version: binary.BigEndian.Uint64(body[5:]), chunk: binary.BigEndian.Uint32(body[13:])}
	copy(r.nonce[:], body[17:33])
	if r.kind != KindManifest && r.kind != KindChunk {
		return request{}, fmt.Errorf("unknown request kind %d", body[4])
	}
	return r, nil
}

// readFrame reads one frame's body into buf (grown as needed).
func readFrame(r io.Reader, buf []byte) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxFrame {
		return nil, fmt.Errorf("frame of %d bytes: more than the %d allowed", size, maxFrame)
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// manifest describes one version's blob.
type manifest struct {
	version uint64
	size    int64
	chunk   int
	sums    []uint32 // CRC-32C of each chunk
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func (m *manifest) count() int { return len(m.sums) }

// span is chunk i's byte range.
func (m *manifest) span(i int) (off, end int64) {
	off = int64(i) * int64(m.chunk)
	return off, min(off+int64(m.chunk), m.size)
}

func chunkCount(size int64, chunk int) int {
	return int((size + int64(chunk) - 1) / int64(chunk))
}

// appendManifestReply appends the whole reply frame to a MANIFEST request with nonce.
func appendManifestReply(b []byte, secret []byte, nonce [16]byte, m *manifest) []byte {
	n := 1 + 8 + 8 + 4 + 4 + len(m.sums)*4 + macLen
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	start := len(b)
	b = append(b, byte(StatusOK))
	b = binary.BigEndian.AppendUint64(b, m.version)
	b = binary.BigEndian.AppendUint64(b, uint64(m.size))
	b = binary.BigEndian.AppendUint32(b, uint32(m.chunk))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.sums)))
	for _, c := range m.sums {
		b = binary.BigEndian.AppendUint32(b, c)
	}
	return append(b, mac(secret, []byte(manMACContext), nonce[:], b[start:])...)
}

// parseManifest checks a MANIFEST reply body with status OK.
func parseManifest(secret []byte, nonce [16]byte, body []byte) (*manifest, error) {
	if len(body) < 25+macLen {
		return nil, fmt.Errorf("manifest reply of %d bytes is too short", len(body))
	}
	end := len(body) - macLen
	if !hmac.Equal(body[end:], mac(secret, []byte(manMACContext), nonce[:], body[:end])) {
		return nil, errors.New("manifest reply has a bad MAC: the holder does not have this job's secret, or the reply was altered")
	}
	m := &manifest{version: binary.BigEndian.Uint64(body[1:]), size: int64(binary.BigEndian.Uint64(body[9:])), chunk: int(binary.BigEndian.Uint32(body[17:]))}
	count := int(binary.BigEndian.Uint32(body[21:]))
	switch {
	case m.size < 0 || m.size > MaxSize:
		return nil, fmt.Errorf("manifest: size %d out of range", m.size)
	case m.chunk < 1:
		return nil, fmt.Errorf("manifest: chunk size %d", m.chunk)
	case count != chunkCount(m.size, m.chunk) || end-25 != count*4:
		return nil, fmt.Errorf("manifest: %d chunks of %d bytes do not make %d bytes", count, m.chunk, m.size)
	}
	m.sums = make([]uint32, count)
	for i := range m.sums {
		m.sums[i] = binary.BigEndian.Uint32(body[25+4*i:])
	}
	return m, nil
}
