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
//
// A record is a bin holding the leader's stored record value unchanged
// (logstore.ReadRaw, checked again by logstore.AppendReplica against its
// offset, base+i): shipping raw values ran 2-5 times faster than
// re-encoding records (shared FACTS.md). Every length and count is checked
// against the bytes left before anything is allocated: frames come from
// the network.
package wire
