// Package wire is the cluster's replication protocol between nodes: a
// frame codec, the messages, and typed error codes (franz-go's layering).
//
// A connection carries frames, each a request answered by one response
// frame, in order:
//
//	+----------------+------+----------------------------------+
//	| length (BE)    | kind | body: one msgpack array          |
//	| 4 bytes        | 1 B  | (length - 1 bytes)               |
//	+----------------+------+----------------------------------+
//
// length counts the kind byte and the body, at most MaxFrame. The kinds:
//
//	1 FetchRequest    [stream, replica id, broker epoch, leader epoch, offset, high watermark, max bytes, max wait ms]
//	2 FetchResponse   [code, leader epoch, high watermark, log start, log end, base, [record, ...]]
//	3 EpochRequest    [stream, replica id, leader epoch, epoch]
//	4 EpochResponse   [code, epoch, end offset]
//	5 CommandRequest  [from, broker epoch, raft term, command]
//	6 CommandResponse [code, refusal, controller id, message]
//	7 ProduceRequest  [stream, from, leader epoch, seq, [record, ...](, [source offset, source start, ...])]
//	8 ProduceResponse [code, seq, first offset, message(, results)]
//	9 StateWriteRequest  [stream, leader epoch, [key, value, ...], [deleted key, ...](, node, broker epoch)]
//	10 StateWriteResponse [code, message(, [moved key, ...])]
//	11 StateFetchRequest  [stream, replica id, leader epoch, held epoch, held seq, max wait ms]
//	12 StateFetchResponse [code, epoch, seq, reset (0|1), [key, value, ...], [deleted key, ...]]
//	13 ClaimRequest   [stream, leader epoch, key, holder, node, broker epoch, release (0|1)]
//	14 ClaimResponse  [code, ok (0|1), current holder]
//
// A connection whose first request is a ProduceRequest is a produce
// pipeline: the leader reads its requests without waiting for the
// answers, which come back in request order, each naming its seq. In a
// ProduceRequest a record is the cluster package's msgpack array of a
// record's producer fields (forward_codec.go), not a stored value: the
// leader assigns offsets and its epoch. An append to a mirror stream
// adds a sixth field, each record's offset in its source and the source's
// log start, and its answer a fifth, one byte per record (appended,
// duplicate, refused): the leader writes each at its source's offset
// (edge/mirror's rules). The shorter forms are the older frames, still
// decoded; a leader that predates the longer ones refuses them.
//
// A state write naming its node and broker epoch is fenced by the
// sessions' claims (the sessions' own keys, and a stream's session
// offsets, checked against the leader's replica of the claims): the
// leader refuses it as a whole (code NotHolder) when a key it touches
// belongs to a claim naming another node or epoch, or to none, and
// lists those keys in the answer's third field. Only such a request gets
// the longer answer; a 4-field request is written unfenced, as before.
//
// A record is a bin holding the leader's stored record value unchanged
// (logstore.ReadRaw, checked again by logstore.AppendReplica against its
// offset, base+i): shipping raw values ran 2-5 times faster than
// re-encoding records (shared FACTS.md). Every length and count is checked
// against the bytes left before anything is allocated: frames come from
// the network.
package wire
