"""Hostile input, each class sent to the real receiver of its topic or command.

Each hostile record must end in <ns>.experiences.rejected with its stage and reason (or, for a
config, exit code 2 and a message naming the field) while the receiver keeps going and the good
records sent around it all come out. Receivers: P = one `undertow process` Faust worker on raw
(test_processor_input.py), T = the trainer's feed on ready (test_trainer_input.py), R = a rollout
worker on tasks and W = its weight subscriber on weights (test_rollout_input.py).

1. Undecodable bytes (garbage, empty, null, cut short, not a map, bad UTF-8):
   P test_undecodable_bytes; T test_the_trainer_dead_letters_what_it_cannot_learn_from; R and W.
2. Wrong schema version, unknown or wrong record kind:
   P test_wrong_schema_version_and_kind; T; R.
3. Missing and extra fields, wrong types: P test_missing_and_extra_fields; R.
4. Token / log-prob / mask / advantage length mismatch: P test_token_and_logprob_length_mismatch; T.
5. NaN / infinite rewards, log-probs, advantages, priority: P test_nan_and_infinite_rewards; T.
   Finite rewards whose advantages overflow float32: P test_rewards_that_overflow_the_advantages.
6. Records over the size limit (MAX_RECORD_BYTES, MAX_TOKENS, Kafka's message limit):
   P test_records_over_the_size_limit; T; R test_a_rollout_worker_dead_letters_bad_tasks_and_oversize_experiences
   (a workflow's experience past the Kafka limit).
7. Groups that never complete (missing samples, group_size mismatch): P test_groups_that_never_complete.
8. A WeightUpdate with a bad checksum, a truncated chunk, a missing chunk, a bad chunk index:
   W test_the_weight_subscriber_refuses_bad_updates_and_keeps_its_weights.
9. An experience id replayed (same bytes; same id with new content; before and after training;
   after a restart that lost the offsets): P test_replayed_experience_id, then
   test_the_trainer_learns_each_id_at_most_once (the trainer's feed over P's output);
   T test_a_replayed_experience_id_is_trained_at_most_once.
10. Invalid and contradictory configs, to `undertow process / train / rollout / feed / run`:
    test_configs.py.
11. A plugin that raises (record processor, group processor, rollout workflow):
    P test_processor_plugin_that_raises; R.

Nothing else lost: P test_nothing_else_was_lost_and_the_worker_still_runs counts every message the
processor tests sent against ready and rejected; T and R compare exact sets of trained ids and
published experiences.
"""
