// Package peerstate brings joining workers up to date: they pull the committed training state
// (a byte blob with a version) in verified chunks from the peers that hold it, from several at
// once, instead of every rank waiting on a broadcast from rank 0 (seed 001).
//
// A holder runs a Server and Publishes each committed version. A joiner's Fetcher asks the
// holders it knows for the manifest (size, chunk size, CRC-32C of every chunk), then fetches
// the chunks in parallel from different holders and checks each against the manifest.
//
// # Busy holders
//
// A Server serving ServerConfig.MaxTransfers chunks already answers BUSY at once; it never
// queues. The Fetcher then marks that holder busy for a fixed 150 ms (FetcherConfig.BusyFor)
// — no counter that grows, no sleep that doubles — and at once tries another holder that is
// not marked, those on its own host (Holder.Host == FetcherConfig.Host) first, then remote
// ones. Only when every known holder is marked busy (or has failed) does it ask the Directory
// who else holds the version (at most once per BusyFor), and only when that names no holder
// it can try does it wait, until the first busy mark expires. A holder that fails (refused
// connection, dies mid-transfer, sends a chunk that fails verification, no longer holds the
// version) is dropped for the rest of the fetch and its chunks are fetched elsewhere. Every
// wait is bounded by the context; when no holder is left the fetch fails with ErrNoHolder.
//
// # Authentication
//
// Every request carries an HMAC-SHA256 keyed by the job secret (worker.Config.Secret, which
// reaches workers only through the launch environment), so a stranger cannot read the model;
// a request with a bad MAC is answered DENIED and the connection closed. The manifest reply is
// MACed too, bound to the request's nonce, so a joiner knows the checksums come from a job
// member, and every chunk is checked against its checksum, so corruption in transit, or in a
// holder's memory after the checksums were taken, is caught and the chunk fetched elsewhere.
// The checksum is CRC-32C, an order of magnitude faster than SHA-256 (which made verification
// most of the cost of a fetch): it detects accidents, not an attacker rewriting traffic on the
// path, who could rewrite allreduce traffic as well; the data is not encrypted either. Keep
// the job on a private network.
//
// # Wire format
//
// TCP; all integers big-endian. Each message is a frame: a uint32 length n, then n bytes
// (n ≤ 4 MiB). A connection carries any number of request/reply exchanges in turn.
//
// Request (n = 65):
//
//	off len  field
//	0   4    magic "EPS1"
//	4   1    kind: 1 MANIFEST, 2 CHUNK
//	5   8    version wanted
//	13  4    chunk index (CHUNK; 0 for MANIFEST)
//	17  16   nonce, random per request
//	33  32   HMAC-SHA256(secret, "elasticd peerstate request\x00" || bytes 0..33)
//
// Reply header:
//
//	0   1    status: 0 OK, 1 BUSY, 2 NO_VERSION, 3 DENIED, 4 BAD_REQUEST
//	1   8    version the holder has (0: none)
//	then, by status and kind:
//	OK MANIFEST   9: size uint64, 17: chunk size uint32, 21: count uint32,
//	              25: count × uint32 CRC-32C (Castagnoli) of each chunk,
//	              then 32 bytes HMAC-SHA256(secret, "elasticd peerstate manifest\x00" ||
//	              request nonce || reply bytes before the MAC)
//	OK CHUNK      9: chunk index uint32, 13: length uint32; the frame ends here and
//	              `length` raw bytes of data follow it (chunk i is bytes
//	              [i·chunk size, min((i+1)·chunk size, size)) of the blob)
//	BUSY, NO_VERSION   nothing more
//	DENIED, BAD_REQUEST  a UTF-8 message to the end of the frame; the holder then closes
//
// A Server holds one version at a time (the last Publish; none after Unpublish); MANIFEST
// and CHUNK requests for any other version are answered NO_VERSION with the version it has
// (0: none). Only CHUNK requests count as transfers against MaxTransfers; MANIFEST is small
// and always answered.
//
// # Wiring
//
// worker.State.Sync runs one Server per process, started the first time the worker holds a
// state to serve (Listen on its host address, port 0). At a reset one allgather tells every
// rank the others' commit counters and Server addresses; when some rank lacks rank 0's
// commit, every rank that holds it Publishes it under that counter, all ranks pass a
// barrier, the others Fetch it from all those holders, and once every fetch is over the
// holders Unpublish. The allgather names every holder, so the worker gives its Fetcher no
// Directory. A fetch that fails falls back, on every rank, to the broadcast from rank 0.
package peerstate
