package mqtt

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// BenchmarkSubscribeDeepFilter is a SUBSCRIBE and its SUBACK: a
// 20,000-level filter refused at the default max_topic_levels, and a
// filter of max_topic_levels granted, which every matcher on the
// subscription path meets (routing's Reach, retained messages, the
// subscription index, mochi's topic index). Both must take microseconds,
// not seconds (logstore's BenchmarkTopicIndexes_Deep has the matchers
// alone).
func BenchmarkSubscribeDeepFilter(b *testing.B) {
	for _, bc := range []struct {
		name   string
		levels int
		filter string
	}{
		{"refused", DefaultMaxTopicLevels, levels("+", 20000)},
		{"granted-128", DefaultMaxTopicLevels, levels("+", DefaultMaxTopicLevels-1) + "/#"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			br := newTestBroker(b, newMemLog(b, "default=a/#", "other=b/+/c"), func(c *Config) { c.MaxTopicLevels = bc.levels })
			raw := dialRaw(b, br, "bench", 5)
			b.SetBytes(int64(len(bc.filter)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				id := uint16(i%60000 + 1)
				raw.Write(packets.Packet{
					FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
					PacketID:    id,
					Filters:     packets.Subscriptions{{Filter: bc.filter, Qos: 1}},
				})
				if ack := raw.ReadUntil(packets.Suback); ack.PacketID != id {
					b.Fatal(fmt.Sprintf("SUBACK %d, want %d", ack.PacketID, id))
				}
			}
		})
	}
}
