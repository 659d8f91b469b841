package rules

import (
	"fmt"
	"slices"
)

// Deleting a stream: DeleteStream leaves a tombstone, ListStreams keeps
// a broker that lists the stream from losing it.

// Command kinds of deletion, apart from commands.go's sequence so that
// commands added there meanwhile keep their numbers.
const (
	kindDeleteStream byte = 32 + iota
	kindListStreams
)

// DeleteStream removes stream Name from the state and leaves a tombstone
// (State.Deleted) naming the incarnation deleted: every node deletes its
// copy when it applies it, or when it is back. Created, when not 0, must
// be the stream's current incarnation (a stream created again since is
// another stream). Refused while a broker's configuration lists the
// stream (ErrStreamListed): that broker would create it again at once.
type DeleteStream struct {
	Name    string
	Created uint64
}

// ListStreams records the streams broker ID, in its broker epoch Epoch,
// has in its configuration (each node submits it when it starts).
type ListStreams struct {
	ID    string
	Epoch uint64
	Names []string
}

func (DeleteStream) kind() byte { return kindDeleteStream }
func (ListStreams) kind() byte  { return kindListStreams }

func decodeDeletion(kind byte, b []byte) (Command, bool, error) {
	switch kind {
	case kindDeleteStream:
		c, err := decodeAs[DeleteStream](b)
		return c, true, err
	case kindListStreams:
		c, err := decodeAs[ListStreams](b)
		return c, true, err
	}
	return nil, false, nil
}

// applyDeletion applies the deletion commands; ok is false for others.
func (s *State) applyDeletion(c Command) (ok bool, err error) {
	switch c := c.(type) {
	case DeleteStream:
		return true, s.deleteStream(c)
	case ListStreams:
		return true, s.listStreams(c)
	}
	return false, nil
}

func (s *State) deleteStream(c DeleteStream) error {
	st := s.Streams[c.Name]
	if st == nil || (c.Created != 0 && c.Created != st.Created) {
		return fmt.Errorf("%w: %s", ErrUnknownStream, c.Name)
	}
	var listing []string
	for _, id := range s.brokerIDs() {
		if b := s.Brokers[id]; !b.Removed && slices.Contains(b.Lists, c.Name) {
			listing = append(listing, id)
		}
	}
	if len(listing) > 0 {
		return fmt.Errorf("%w: %s is in the streams: of %v: remove it there and restart them first "+
			"(a node that lists it would create it again)", ErrStreamListed, c.Name, listing)
	}
	delete(s.Streams, c.Name)
	if s.Deleted == nil {
		s.Deleted = map[string]uint64{}
	}
	s.Deleted[c.Name] = st.Created
	return nil
}

func (s *State) listStreams(c ListStreams) error {
	b := s.Brokers[c.ID]
	switch {
	case b == nil:
		return fmt.Errorf("%w: %s", ErrUnknownBroker, c.ID)
	case c.Epoch != b.Epoch:
		return fmt.Errorf("%w: %s lists its streams in epoch %d, runs %d", ErrStaleBrokerEpoch, c.ID, c.Epoch, b.Epoch)
	}
	b.Lists = slices.Sorted(slices.Values(c.Names))
	return nil
}

func (s *State) brokerIDs() []string {
	ids := make([]string, 0, len(s.Brokers))
	for id := range s.Brokers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
