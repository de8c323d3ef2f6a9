// Package ledger is watcher's audit ledger: an append-only, hash-chained,
// sampled, signed record of every event the agent saw, verifiable offline.
//
// # Layout
//
// A ledger is a directory:
//
//	seg-<first seq, 20 digits>.jsonl      segments (the last one is active)
//	seg-<first seq>.jsonl.zst             rolled-over segments, zstd-compressed
//	checkpoint                            the latest signed checkpoint and its
//	                                      witness cosignatures
//	checkpoints                           every checkpoint signed (append-only)
//	tree-<level>.hashes                   the Merkle tree as C2SP tlog-tiles
//	                                      (see tiles.go)
//	ckpt-<size, 20 digits>.note           signed checkpoints of ledgers written
//	                                      before; Open moves them into checkpoints
//	ledger.pub                            the checkpoint verifier key
//	ledger.key                            the Ed25519 signing key, mode 0600
//	                                      (Options.KeyFile may put it elsewhere)
//	LOCK                                  flock(2) held by the one writer
//
// Any other file makes Open fail with an error naming it. The number of
// files does not grow with checkpoints: per million records of about 300
// bytes there are about 5 segments (64 MiB each) and the fixed files
// (checkpoint, checkpoints, tree-0..tree-2 up to 16.7M records, ledger.pub,
// ledger.key, LOCK).
//
// # Encoding
//
// Records are JSON lines, one per record:
//
//	{"seq":41,"prev":"<sha256 hex>","time":"...","kind":"file_open",...,"hash":"<sha256 hex>"}
//
// JSON lines were chosen over a binary format because an investigator can
// read, grep and filter the ledger with ordinary tools (zstdcat, jq) on any
// machine, without trusting watcher's own decoder, and because the event
// fields are the same ones audit.Event's JSON tags define. Speed comes from
// a hand-written encoder (no reflection, no allocation) that produces
// exactly what encoding/json would for the same event (a test checks this
// for every field), and from a frame whose fixed layout the verifier can
// check without parsing JSON: "seq" and "prev" lead, "hash" (64 hex digits)
// ends the line.
//
// The encoding is canonical: the writer is the only producer of record
// bytes, map keys are sorted, times are UTC RFC 3339, and decoding and
// re-encoding a record gives the same bytes. Hashes are computed over the
// bytes as stored, so no second canonicalisation is needed to verify.
//
// # Hash chain and Merkle tree
//
// A record's hash is tlog.RecordHash of its line up to (not including) the
// `,"hash":"` suffix, that is SHA-256(0x00 || bytes). The bytes include the
// previous record's hash ("prev"), so the records form a hash chain, and the
// same hash is the record's leaf in an RFC 6962 Merkle tree (the tree of
// golang.org/x/mod/sumdb/tlog). Record seq is leaf seq; the first record
// (seq 0) is a genesis record binding the ledger's random id and public key.
//
// Each segment starts with a header line (not part of the chain) giving the
// ledger id, the key, the first seq, the previous record's hash and the
// Merkle "frontier" before the segment (the roots of the complete subtrees
// covering all earlier records, one per set bit of first seq). Every header
// field is cross-checked by the verifier, and the frontier lets the tree be
// continued when retention has removed older segments.
//
// # Checkpoints
//
// At intervals (CheckpointEvery records, CheckpointInterval time) and at
// Close, the ledger signs a checkpoint: a C2SP tlog-checkpoint ("origin",
// size, base64 root hash, and a "time" extension line) inside a C2SP signed
// note, signed with golang.org/x/mod/sumdb/note's Ed25519 signer. A
// checkpoint only ever covers acknowledged records. Anyone with root can
// recompute every hash after editing a record, but cannot forge a
// checkpoint signature: with a checkpoint copied off the host (see
// LastCheckpoint), rewritten history and a truncated tail are detected.
// Records after the last checkpoint are protected by the chain alone; the
// verifier says how many. `watcher ledger prove SEQ` gives an inclusion
// proof of one record in a checkpoint, checkable offline.
//
// # Durability
//
// Appends go to an in-memory buffer; the buffer is written (write(2)) when
// it reaches BufferBytes and at every group commit, and a group commit
// fdatasyncs the segment. Group commits happen every SyncInterval and, when
// an alert was appended, at once (alerts arriving while a commit is in
// flight share the next one). Appends do not wait for commits.
//
// A record is acknowledged when Durable() is greater than its sequence
// number, which is also the case once a Sync (or Checkpoint, or Close)
// called after its Append has returned nil. The guarantee: an acknowledged
// record survives a crash of the process (SIGKILL) and of the machine,
// insofar as the file system honours fdatasync. A record not yet
// acknowledged may be lost in a crash: at most what was appended in the
// last SyncInterval, or since the last alert commit. A crash can leave a
// torn record at the end of the active segment; Open cuts the segment back
// to the last complete record and appends a recovery record stating the
// offset, length and SHA-256 of what was cut. Nothing before the torn
// record is touched; an invalid record followed by valid ones is corruption,
// not a torn tail, and Open refuses to cut it.
//
// # Sampling
//
// Routine events are kept 1 in Options.SampleEvery per sandbox and kind
// (pipeline.Sampler, the sample stage, run under the ledger's lock on every
// append), deterministically given Options.Seed (the n-th routine event of a
// sandbox and kind is kept when (n + phase) mod N = 0, with the phase
// derived from the seed, sandbox and kind). Alerts (audit.Event.IsAlert:
// denials, kills, losses, recoveries, escapes, severity alert) are always
// kept. Every SummaryInterval and at Close a sample_summary record gives,
// per sandbox and kind, how many events were offered (seen) and written
// (kept) since the previous summary, alerts included, so sampled-out events
// are accounted for in the chain.
//
// # Losses
//
// What the agent knows it lost it reports with RecordLoss, which writes a
// loss record. When the ledger itself cannot write (ENOSPC, EIO), it cuts
// the segment back to its last complete record, counts every record it
// accepted but could not write (Stats.Unwritten, Stats.PendingLoss), keeps
// accepting events without blocking the agent, and retries at every group
// commit; the first successful write is a loss record (stage "ledger_write")
// with the count. The sink never fails because of a write error: a failing
// audit.Sink is dropped by the fan-out, and losing the ledger is worse.
//
// # Rotation, compression, retention
//
// The active segment rolls over at SegmentMaxBytes or SegmentMaxAge; the
// new segment's header links to the last record of the old one. With
// Compress, rolled-over segments are compressed with zstd (written to a
// temporary file, fsynced and renamed before the original is removed).
// Retention removes the oldest rolled-over segments by age or total size,
// after committing a record saying which records are being removed, so a
// verifier can tell retention from deletion.
//
// # Redaction
//
// No record is hashed unredacted: audit.Redact replaces secrets
// (password=, token=, Authorization headers, AWS keys, private key blocks,
// long high-entropy argv tokens) with "***" and lists the fields in the
// event's Redacted. Append and Notify redact every event they take; the
// agent's pipeline redacts once in its redact stage and its ledger sink
// appends with AppendRedacted, which does not redact again.
//
// # Verification
//
// Verify reads the directory with memory independent of its size and
// checks every header, link, sequence number, stored hash, checkpoint
// signature and Merkle root. It locates the first bad record by sequence
// number, file and byte offset; a checkpoint whose root does not match
// locates the rewrite to the range between the previous matching checkpoint
// and it (a rewrite that recomputed every hash leaves nothing finer to go
// by).
package ledger
