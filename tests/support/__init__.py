"""Helpers shared by the test folders: Flink value encoders, loopback servers, the fixtures'
normalised entries, the series fixtures, a Flink session cluster, recorded REST replays."""
