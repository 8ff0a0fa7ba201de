package allreduce

import (
	"encoding/binary"
	"fmt"
)

// Wire format (docs/protocol.md): every message is a 40-byte little-endian header followed by
// `length` payload bytes.
//
//	0  magic   u32  "ELAR"
//	4  kind    u8   hello | data | abort | rehello | shm
//	5  op      u8   the collective (data), 0 otherwise
//	6  dtype   u8   element type (data), 0 otherwise
//	7  flags   u8   reserved, 0
//	8  gen     u64  generation
//	16 seq     u64  operation sequence number within the generation (data); previous generation (rehello)
//	24 total   u64  bytes of the whole operation on the sender (data); world size (hello, rehello)
//	32 unit    u32  unit index within the operation (data); sender rank (hello, rehello); blamed rank (abort)
//	36 length  u32  payload bytes
const (
	headerLen = 40
	magic     = 0x52414c45 // "ELAR" little-endian

	kindHello = 1
	kindData  = 2
	kindAbort = 3
	// kindRehello opens a connection carried over from the previous generation (reuse.go).
	kindRehello = 4
	// kindShm offers a shared-memory segment, or answers an offer (shmpeer.go).
	kindShm = 5

	// maxAbortLen bounds the reason text in an abort frame.
	maxAbortLen = 1024
)

type header struct {
	kind   uint8
	op     uint8
	dtype  uint8
	gen    uint64
	seq    uint64
	total  uint64
	unit   uint32
	length uint32
}

func (h *header) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], magic)
	b[4] = h.kind
	b[5] = h.op
	b[6] = h.dtype
	b[7] = 0
	binary.LittleEndian.PutUint64(b[8:], h.gen)
	binary.LittleEndian.PutUint64(b[16:], h.seq)
	binary.LittleEndian.PutUint64(b[24:], h.total)
	binary.LittleEndian.PutUint32(b[32:], h.unit)
	binary.LittleEndian.PutUint32(b[36:], h.length)
}

// parseHeader decodes b; it checks only what holds for every frame (magic, kind, flags).
func parseHeader(b []byte) (header, error) {
	if m := binary.LittleEndian.Uint32(b[0:]); m != magic {
		return header{}, fmt.Errorf("bad magic %#08x (not an elasticd allreduce peer, or the stream lost its framing)", m)
	}
	h := header{
		kind:   b[4],
		op:     b[5],
		dtype:  b[6],
		gen:    binary.LittleEndian.Uint64(b[8:]),
		seq:    binary.LittleEndian.Uint64(b[16:]),
		total:  binary.LittleEndian.Uint64(b[24:]),
		unit:   binary.LittleEndian.Uint32(b[32:]),
		length: binary.LittleEndian.Uint32(b[36:]),
	}
	if h.kind < kindHello || h.kind > kindShm {
		return header{}, fmt.Errorf("unknown frame kind %d", h.kind)
	}
	if b[7] != 0 {
		return header{}, fmt.Errorf("unknown flags %#02x", b[7])
	}
	return h, nil
}
