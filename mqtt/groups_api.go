package mqtt

import (
	"context"
	"fmt"
)

// Consumer groups for consumers inside the node, such as upstream sinks,
// which read the log directly rather than over MQTT: their positions are
// groups like any other, but named with a leading $ (such as $sink.cloud),
// which keeps them out of MQTT clients' reach (tenancy.go).

// GroupOffset returns group's durable committed offset in stream (ok is
// false while it has none) and a channel closed when that changes: by a
// commit here, a publish to $offsets/<group>/<stream> (not for a $
// group), or the stream's
// state moving to this node.
func (b *Broker) GroupOffset(group, stream string) (off uint64, ok bool, changed <-chan struct{}) {
	return b.deliv.groups.watch(groupKey{group: group, stream: stream})
}

// CommitGroup sets group's committed offset in stream to off and returns
// once it is durable, or when ctx ends (the commit may still land). off
// must not be beyond the stream's committed end; a group's MQTT consumer,
// if it has one, continues from off.
func (b *Broker) CommitGroup(ctx context.Context, group, stream string, off uint64) error {
	if err := validName(group); err != nil {
		return fmt.Errorf("commit group %q: group name %w", group, err)
	}
	s := b.deliv.log.Stream(stream)
	if s == nil {
		return fmt.Errorf("commit group %q: no stream %q", group, stream)
	}
	if end := s.Committed(); off > end {
		return fmt.Errorf("commit group %q: offset %d is beyond the end of stream %q (%d)", group, off, stream, end)
	}
	done := make(chan error, 1)
	b.deliv.groups.commit(groupKey{group: group, stream: stream}, off, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("commit group %q in %s: %w", group, stream, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("commit group %q in %s: %w", group, stream, ctx.Err())
	}
}

// GroupStateKey is the key of group's committed offset in its stream's
// state (Stream.LoadState), whose value is the offset as 8 big-endian
// bytes: what a reader of a replica's state (a site's sinks) looks up.
func GroupStateKey(group string) string { return groupStatePrefix + group }
