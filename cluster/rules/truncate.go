package rules

// TruncateTo is where a follower truncates its log before it fetches
// from a new leader (KIP-101/279): leaderEnd is where the leader's log
// of the epoch it answered with ends; ownEnd, when haveOwn, where the
// follower's own log of that epoch ends; logEnd is the follower's log
// end. It truncates at the lower of the two ends, so that no record the
// leader does not have stays; ok is false when that end is at or past
// logEnd (nothing to cut).
func TruncateTo(leaderEnd, ownEnd uint64, haveOwn bool, logEnd uint64) (end uint64, ok bool) {
	end = leaderEnd
	if haveOwn {
		end = min(end, ownEnd)
	}
	return end, end < logEnd
}
