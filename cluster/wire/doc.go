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
//	15 HeartbeatRequest  [from, broker epoch, raft contact ms]
//	16 HeartbeatResponse [code, controller id]
//
// Integers and lengths take their shortest msgpack form, a bool is 0 or
// 1, a string is a str, a record or a value a bin, a list an array (a
// key-value list [key, value, ...]). A field in parentheses is one of a
// message's optional trailing fields: a sender writes them only when the
// first of them is not empty, and a receiver takes the shorter array (the
// older frame) or the whole one, refusing a whole one whose first
// optional field is empty.
//
// A connection whose first request is a ProduceRequest is a produce
// pipeline: the leader reads its requests without waiting for the
// answers, which come back in request order, each naming its seq. A seq
// names one append of the sending node: a producer id in the high 32
// bits (0 from a node that predates them) and a count in the low 32; an
// append sent again, on another connection, keeps its seq, and the
// leader answers it as it answered the first copy. In a
// ProduceRequest a record is not a stored value but a ProducedRecord, the
// producer's fields (the leader assigns offsets and its epoch):
//
//	[timestamp, topic, payload, qos, retain, client id, message expiry,
//	 content type, payload format, response topic, correlation data,
//	 [user property key, value, ...]]
//
// in the form msgpack's reflection gave the cluster package's struct
// before the codec was generated: the integers keep their Go type's width
// (int64 timestamp, uint8 qos and payload format, uint32 expiry), retain
// is msgpack's bool, and a missing payload format, a nil payload or
// correlation data and no user properties are nil. An append to a mirror stream
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
//
// The codec, codec_gen.go, is generated: `go generate ./cluster/wire` runs
// internal/gen, which reads the message structs (messages.go, forward.go,
// record.go; a //wire:message line ends each one's doc comment) and
// writes, for each, an AppendTo and a Decode that call codec.go's helper
// for each field's type in the order the struct declares them. To change
// a message, change its struct and run go generate; internal/gen's test
// fails while codec_gen.go is stale. A field is only ever appended, as an
// optional trailing one (`wire:"opt"`), so that a node of the earlier
// release still reads the frame: testdata/golden.txt holds the bytes every
// message had when the codec was written by hand, and the tests hold the
// generated codec to them.
package wire
