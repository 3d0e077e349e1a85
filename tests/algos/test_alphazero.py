"""AlphaZero's pieces against hand computations and small games: PUCT selection and the
sign-flipping backup on a hand-computed tree, the search's forced win and forced block on
tic-tac-toe, the policy-value loss against a loop written from the paper, the samples the
actor policy makes of a finished game, and the learner's checks of what it receives."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zrl.algos.alphazero.losses import policy_value_loss
from zrl.algos.alphazero.player import SearchPlayer, search_player, searched_counts
from zrl.algos.alphazero.policy import AlphaZeroPolicy, game_outcomes
from zrl.algos.alphazero.search import (
    Node,
    SearchConfig,
    add_root_noise,
    backup,
    mirror_indices,
    observations,
    puct_scores,
    search,
    select,
    visit_policy,
)
from zrl.algos.alphazero.update import AlphaZeroUpdate
from zrl.algos.api.actor import Trajectory
from zrl.algos.models import experiment_model
from zrl.config.experiment import ExperimentConfig
from zrl.envs.multiagent.envs import fixed_opponents, make_multiagent_vector_env
from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.search import Bitboards, observation
from zrl.testing.fakes import actor_setup, learner_setup
from zrl.transport import protocol as P

TTT = GAMES["tictactoe"]


def bits(*squares: int) -> int:
    return sum(1 << s for s in squares)


def uniform(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Priors uniform over every action, value 0: the search alone must find the moves."""
    return np.full((len(obs), TTT.num_actions), 1.0 / TTT.num_actions), np.zeros(len(obs))


# --- PUCT and backup on a hand-computed tree -----------------------------------------------


def test_puct_scores_and_selection_by_hand():
    prior = [0.5, 0.3, 0.2]
    visits = [2.0, 1.0, 0.0]
    value_sum = [1.0, -0.5, 0.0]
    # sum N = 3: U = 1.0 * P * sqrt(3) / (1 + N); Q = W / N, 0 unvisited.
    expected = [0.5 + 0.5 * math.sqrt(3) / 3, -0.5 + 0.3 * math.sqrt(3) / 2, 0.2 * math.sqrt(3)]
    assert puct_scores(prior, visits, value_sum, 1.0) == pytest.approx(expected)
    assert puct_scores(prior, visits, value_sum, 1.0) == pytest.approx(
        [0.788675, -0.240192, 0.346410], abs=1e-6
    )
    node = Node(0, 0, actions=[4, 5, 6], prior=prior, visits=visits, value_sum=value_sum)
    node.children = [None] * 3
    assert select(node, 1.0) == 0
    # A larger c_puct makes the unvisited move's prior win: c = 4 gives 0.5 + 1.155 = 1.655,
    # -0.5 + 1.039 = 0.539 and 1.386 -> still 0; c = 8: 2.809, 1.578, 2.771 -> 0; with the
    # first move's value worse (W = -1) at c = 8: -0.5 + 2.309 = 1.809 < 2.771 -> move 2.
    node.value_sum = [-1.0, -0.5, 0.0]
    assert select(node, 8.0) == 2
    # Before any visit the priors alone choose (sqrt(max(1, 0)) = 1).
    fresh = Node(0, 0, actions=[0, 1, 2], prior=[0.2, 0.7, 0.1])
    fresh.visits, fresh.value_sum = [0.0] * 3, [0.0] * 3
    assert select(fresh, 1.0) == 1


def test_backup_flips_the_sign_at_every_ply():
    root = Node(0, 0, actions=[0, 1], prior=[0.5, 0.5], visits=[0.0] * 2, value_sum=[0.0] * 2)
    mid = Node(0, 0, actions=[2, 3], prior=[0.5, 0.5], visits=[0.0] * 2, value_sum=[0.0] * 2)
    # The leaf is worth +0.6 to its player to move: the move into it (mid's, by the other
    # player) scores -0.6 for mid's mover, and the root's move into mid +0.6 for the root's.
    backup([(root, 0), (mid, 1)], 0.6)
    assert root.visits == [1.0, 0.0] and mid.visits == [0.0, 1.0]
    assert root.value_sum == pytest.approx([0.6, 0.0])
    assert mid.value_sum == pytest.approx([0.0, -0.6])
    backup([(root, 0), (mid, 0)], -1.0)  # a leaf lost for its mover: a win for mid's mover
    assert mid.value_sum == pytest.approx([1.0, -0.6])
    assert root.value_sum == pytest.approx([-0.4, 0.0])
    assert root.visits == [2.0, 0.0]


def test_visit_policy_temperatures_and_root_noise():
    assert visit_policy(np.array([1.0, 3.0, 0.0]), 1.0).tolist() == [0.25, 0.75, 0.0]
    assert visit_policy(np.array([1.0, 3.0, 3.0]), 0.0).tolist() == [0.0, 0.5, 0.5]
    sharp = visit_policy(np.array([1.0, 2.0]), 0.5)  # squares: 1/5, 4/5
    assert sharp.tolist() == pytest.approx([0.2, 0.8])
    node = Node(0, 0, actions=[0, 1, 2], prior=[1.0, 0.0, 0.0])
    add_root_noise(node, 0.3, 0.25, np.random.default_rng(0))
    assert sum(node.prior) == pytest.approx(1.0)
    assert node.prior[0] >= 0.75 and min(node.prior[1:]) > 0


# --- search on tic-tac-toe -------------------------------------------------------------------


def best_move(mine: int, theirs: int, simulations: int = 200) -> tuple[int, np.ndarray]:
    roots, evaluated = search(
        TTT, [(mine, theirs)], uniform, SearchConfig(simulations), np.random.default_rng(0)
    )
    counts = np.zeros(9)
    counts[roots[0].actions] = roots[0].visits
    assert counts.sum() == simulations and evaluated <= simulations + 1
    return int(counts.argmax()), counts


def test_search_finds_the_forced_win():
    # X (to move) holds 0 and 1, O holds 3 and 4: X wins at 2 (O would win at 5).
    move, counts = best_move(bits(0, 1), bits(3, 4))
    assert move == 2, counts
    # Without search the uniform priors would not know it: the visits do.
    assert counts[2] > 0.5 * counts.sum()


def test_search_finds_the_forced_block():
    # X (to move) holds 0 and 7, O holds 3 and 4 and wins at 5 unless X blocks it; X has no
    # win of its own. Every other move loses at once.
    move, counts = best_move(bits(0, 7), bits(3, 4))
    assert move == 5, counts


def test_search_trees_of_several_games_share_each_forward():
    calls: list[int] = []

    def counting(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(obs))
        return uniform(obs)

    positions = [(bits(0, 1), bits(3, 4)), (bits(0, 7), bits(3, 4)), (0, 0)]
    roots, evaluated = search(TTT, positions, counting, SearchConfig(16), np.random.default_rng(1))
    assert len(calls) <= 17 and max(calls) == 3  # the roots, then one call per simulation
    assert sum(calls) == evaluated
    assert [sum(r.visits) for r in roots] == [16, 16, 16]


def test_the_search_player_plays_from_observations():
    cfg = tictactoe_config()
    model = make_model(cfg)
    player = SearchPlayer(model, TTT, simulations=64, c_puct=1.5)
    obs = np.stack(
        [observation(TTT, bits(0, 1), bits(3, 4)), observation(TTT, bits(0, 7), bits(3, 4))]
    )
    assert player.actions(obs).tolist() == [2, 5]
    # A position whose game is over is not searched: its move is the first legal one.
    over = observation(TTT, bits(3, 4, 8), bits(0, 1, 2))
    counts, _ = searched_counts(TTT, over[None], uniform, SearchConfig(4), np.random.default_rng(0))
    assert counts.sum() == 0


# --- the policy-value loss -----------------------------------------------------------------


def reference_loss(logits, value, pi, z, legal, value_coef):
    """AlphaZero's l = (z - v)^2 - pi^T log p, p the softmax over the legal moves, averaged."""
    total_p = total_v = 0.0
    for b in range(len(logits)):
        moves = [a for a in range(logits.shape[1]) if legal[b, a]]
        norm = math.log(sum(math.exp(logits[b, a]) for a in moves))
        total_p -= sum(pi[b, a] * (logits[b, a] - norm) for a in moves)
        total_v += (z[b] - value[b]) ** 2
    n = len(logits)
    return total_p / n + value_coef * total_v / n, total_p / n, total_v / n


def test_policy_value_loss_matches_a_reference_loop():
    rng = np.random.default_rng(0)
    B, A = 6, 9
    legal = rng.random((B, A)) < 0.6
    legal[:, 0] = True
    logits = rng.normal(size=(B, A))
    pi = rng.random((B, A)) * legal
    pi /= pi.sum(axis=1, keepdims=True)
    value, z = rng.uniform(-1, 1, B), rng.choice([-1.0, 0.0, 1.0], B)
    masked = np.where(legal, logits, -1e9)  # the model's masked logits
    got = policy_value_loss(
        torch.tensor(masked, dtype=torch.float32),
        torch.tensor(value, dtype=torch.float32),
        torch.tensor(pi, dtype=torch.float32),
        torch.tensor(z, dtype=torch.float32),
        value_coef=0.5,
    )
    want = reference_loss(logits, value, pi, z, legal, 0.5)
    assert [float(x) for x in got] == pytest.approx(want, rel=1e-5)


# --- the actor policy and the learner -----------------------------------------------------


def tictactoe_config(**alphazero) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "algo": "alphazero",
            "seed": 1,
            "env": {
                "id": "pettingzoo/tictactoe_v3",
                "num_envs": 2,
                "multiagent": {"opponent": "self", "self_play_seats": "both"},
            },
            "model": {"hidden": [32]},
            "roles": {"actors": 1, "replay": 0, "learners": 1},
            "alphazero": {"simulations": 8, "min_samples": 4, "batch_size": 4, **alphazero},
        }
    )


def spaces(cfg: ExperimentConfig):
    envs = make_multiagent_vector_env(cfg.env.id, {}, cfg.env.multiagent, 1)
    out = envs.single_observation_space, envs.single_action_space
    envs.close()
    return out


def make_model(cfg: ExperimentConfig):
    torch.manual_seed(0)
    return experiment_model(cfg, *spaces(cfg)).eval()


def test_config_refuses_what_alphazero_cannot_play():
    with pytest.raises(ValueError, match="self_play_seats: both"):
        ExperimentConfig.model_validate(
            {**tictactoe_config().model_dump(), "env": {"id": "pettingzoo/tictactoe_v3"}}
        )
    with pytest.raises(ValueError, match="searches the model"):
        ExperimentConfig.model_validate(
            {**tictactoe_config().model_dump(), "env": {"id": "CartPole-v1"}}
        )


def test_the_policy_plays_real_games_and_sends_each_mover_its_outcome():
    cfg = tictactoe_config()
    model = make_model(cfg)
    envs = make_multiagent_vector_env(cfg.env.id, {}, cfg.env.multiagent, 2)
    envs.opponents = fixed_opponents(envs, "self", seed=0)  # as the actor's: the slot plays both
    policy = AlphaZeroPolicy(actor_setup(cfg, model, *spaces(cfg), num_envs=2))
    obs, _ = envs.reset(seed=0)
    T, E = 12, 2  # a game is at most 9 moves: each env finishes one, and starts another
    rec = {k: [] for k in ("obs", "reward", "terminated", "truncated", "passes")}
    extras: dict[str, list] = {"policy": [], "move": []}
    needs_reset = np.zeros(E, bool)
    valid = np.ones((T, E), bool)
    for t in range(T):
        valid[t] = ~needs_reset
        if needs_reset.any():
            policy.episodes_started(np.flatnonzero(needs_reset))
        action, ex = policy.act(obs.astype(np.float32), t)
        rec["obs"].append(obs.astype(np.float32))
        for k in extras:
            extras[k].append(ex[k])
        obs, r, term, trunc, info = envs.step(action)
        for k, v in (("reward", r), ("terminated", term), ("truncated", trunc)):
            rec[k].append(v)
        rec["passes"].append(info["passes"])
        needs_reset = term | trunc
    envs.close()

    def em(x):
        return np.swapaxes(np.array(x), 0, 1)

    traj = Trajectory(
        obs=em(rec["obs"]),
        next_obs=None,
        action=np.zeros((E, T), np.int64),
        reward=em(rec["reward"]).astype(np.float32),
        terminated=em(rec["terminated"]),
        truncated=em(rec["truncated"]),
        valid=em(valid),
        final_obs=obs,
        extras={
            "policy": em(extras["policy"]),
            "move": em(extras["move"]),
            "passes": em(rec["passes"]),
        },
    )
    out = policy.finish(traj)
    assert out.kind == P.TRAJECTORY
    obs_out, pi, z = out.arrays["obs"], out.arrays["policy"], out.arrays["value"]
    finished = int(traj.terminated.sum())
    assert len(z) == len(obs_out) == len(pi) > 0 and policy.games == finished >= 2
    assert np.allclose(pi.sum(axis=1), 1.0)
    legal = obs_out[:, 18:27] > 0.5
    assert (pi[~legal] == 0).all()
    # The finished games' moves, env by env: movers alternate, so outcomes alternate in
    # sign, and the last mover's is the final reward's sign.
    start = 0
    for e in range(E):
        game: list[int] = []
        for t in range(T):
            if not traj.valid[e, t]:
                continue
            game.append(t)
            if traj.terminated[e, t]:
                game_z = z[start : start + len(game)]
                assert np.array_equal(obs_out[start], traj.obs[e, game[0]])
                assert game_z[-1] == np.sign(traj.reward[e, t])
                if game_z[-1] != 0:
                    assert (game_z[:-1] * game_z[1:] == -1).all()
                start += len(game)
                game = []
    assert start == len(z)
    # The unfinished games wait for their end in the policy.
    assert sum(len(g) for g in policy.open) > 0


def test_game_outcomes_flip_where_the_turn_passed():
    assert game_outcomes(np.array([0.0, 0.0, 1.0]), np.array([True, True, False])).tolist() == [
        1.0,
        -1.0,
        1.0,
    ]
    assert game_outcomes(np.array([0.0, -1.0]), np.array([False, False])).tolist() == [-1.0, -1.0]


def samples_msg(n: int, rng: np.random.Generator) -> P.Message:
    obs = np.stack([observation(TTT, bits(0), bits(4)) for _ in range(n)]).astype(np.float32)
    pi = np.zeros((n, 9), np.float32)
    pi[:, [1, 2, 8]] = rng.dirichlet(np.ones(3), n)
    z = rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32)
    return P.Message(P.TRAJECTORY, meta={}, arrays={"obs": obs, "policy": pi, "value": z})


def test_the_learner_checks_what_it_receives_and_trains():
    cfg = tictactoe_config()
    model = make_model(cfg).train()
    up = AlphaZeroUpdate(learner_setup(cfg, model, *spaces(cfg)))
    rng = np.random.default_rng(0)
    assert up.train(0) is None  # nothing yet
    bad = samples_msg(4, rng)
    bad.arrays["policy"][0] = 0.0
    bad.arrays["policy"][0, 4] = 1.0  # square 4 is taken: an illegal move
    with pytest.raises(P.ProtocolError, match="illegal"):
        up.receive(bad, 0)
    bad = samples_msg(4, rng)
    bad.arrays["policy"][1] *= 2
    with pytest.raises(P.ProtocolError, match="not a distribution"):
        up.receive(bad, 0)
    bad = samples_msg(4, rng)
    bad.arrays["value"][2] = 3.0
    with pytest.raises(P.ProtocolError, match="outside"):
        up.receive(bad, 0)
    assert up.received == 0
    up.receive(samples_msg(2, rng), 0)
    assert up.train(0) is None  # fewer than min_samples
    before = {k: v.clone() for k, v in model.state_dict().items()}
    up.receive(samples_msg(2, rng), 0)
    results = [up.train(0) for _ in range(10)]
    # 4 samples x reuse 4 / batch 4: four updates, then it waits for more games.
    assert sum(r is not None for r in results) == 4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    state = up.state_dict()
    fresh = AlphaZeroUpdate(learner_setup(cfg, make_model(cfg).train(), *spaces(cfg)))
    fresh.load_state_dict(state)
    assert fresh.updates == 4
    for k, v in fresh.model.state_dict().items():
        assert torch.equal(v, model.state_dict()[k])
    # The window comes back with the weights, oldest first, and trains at once.
    assert fresh.window.size == 4
    for mine, theirs in zip(fresh.window.ordered(), up.window.ordered(), strict=True):
        assert np.array_equal(mine, theirs)
    up.receive(samples_msg(2, rng), 0)
    fresh.receive(samples_msg(2, rng), 0)
    assert fresh.train(0) is not None
    small = AlphaZeroUpdate(
        learner_setup(
            tictactoe_config(window=3, min_samples=2), make_model(cfg).train(), *spaces(cfg)
        )
    )
    small.load_state_dict(up.state_dict())  # a smaller window keeps the newest
    assert small.window.size == 3
    assert np.array_equal(small.window.ordered()[2], up.window.ordered()[2][-3:])


@pytest.mark.parametrize("name", ["tictactoe", "connect_four"])
def test_batched_observations_are_the_envs(name):
    game = GAMES[name]
    boards = Bitboards(game)
    rng = np.random.default_rng(0)
    positions = [(0, 0)]
    for _ in range(60):  # random games' positions, the player to move's view
        mine, theirs = 0, 0
        for _ in range(int(rng.integers(1, game.rows * game.cols))):
            moves = boards.moves(mine | theirs)
            if not moves:
                break
            _, bit = moves[int(rng.integers(len(moves)))]
            mine, theirs = theirs, mine | bit
            positions.append((mine, theirs))
    want = np.stack([observation(game, m, t) for m, t in positions])
    assert np.array_equal(observations(game, positions), want)


def mirrored(game, pieces: int) -> int:
    """A bitboard mirrored left-right, square by square (the reference for mirror_indices)."""
    out = 0
    for sq in range(game.rows * game.cols):
        if pieces >> sq & 1:
            r, c = divmod(sq, game.cols)
            out |= 1 << (r * game.cols + game.cols - 1 - c)
    return out


@pytest.mark.parametrize("name", ["tictactoe", "connect_four"])
def test_the_mirror_of_an_observation_is_the_mirrored_positions(name):
    game = GAMES[name]
    boards = Bitboards(game)
    obs_index, action_index = mirror_indices(game)
    rng = np.random.default_rng(1)
    mine, theirs = 0, 0
    for _ in range(game.rows * game.cols - 1):
        moves = boards.moves(mine | theirs)
        _, bit = moves[int(rng.integers(len(moves)))]
        mine, theirs = theirs, mine | bit
        want = observation(game, mirrored(game, mine), mirrored(game, theirs))
        assert np.array_equal(observation(game, mine, theirs)[obs_index], want)
        # A move's mirror is the move to the mirrored square (the same column's, with gravity).
        legal = {a: bit for a, bit in boards.moves(mine | theirs)}
        mirror_legal = dict(boards.moves(mirrored(game, mine | theirs)))
        for a, bit in legal.items():
            assert mirror_legal[action_index[a]] == mirrored(game, bit)
    assert sorted(action_index) == list(range(game.num_actions))  # a permutation


def test_the_learner_trains_on_mirrored_samples_half_the_time():
    cfg = tictactoe_config()
    up = AlphaZeroUpdate(learner_setup(cfg, make_model(cfg).train(), *spaces(cfg)))
    rng = np.random.default_rng(0)
    msg = samples_msg(1, rng)
    up.receive(msg, 0)
    obs_index, action_index = mirror_indices(TTT)
    obs, policy, value = up.sampled(400)
    original = np.all(obs == msg.arrays["obs"][0], axis=1)
    flipped = np.all(obs == msg.arrays["obs"][0][obs_index], axis=1)
    assert np.all(original | flipped) and 150 < flipped.sum() < 250
    assert np.array_equal(policy[flipped][0], msg.arrays["policy"][0][action_index])
    assert np.array_equal(policy[original & ~flipped][0], msg.arrays["policy"][0])
    assert np.all(value == msg.arrays["value"][0])
    off = AlphaZeroUpdate(
        learner_setup(tictactoe_config(mirror=False), make_model(cfg).train(), *spaces(cfg))
    )
    off.receive(msg, 0)
    assert np.all(off.sampled(50)[0] == msg.arrays["obs"][0])


def test_the_evaluators_search_player_plays_both_seats_against_random():
    from zrl.roles.evaluation import greedy_returns, seat_outcome_rates

    cfg = tictactoe_config(eval_simulations=64)
    player = search_player(make_model(cfg), cfg, TTT, seed=0)
    assert player is not None
    assert search_player(make_model(cfg), tictactoe_config(eval_simulations=0), TTT, 0) is None

    def make_envs(n: int):
        envs = make_multiagent_vector_env(cfg.env.id, {}, cfg.env.multiagent, n)
        envs.opponents = fixed_opponents(envs, "random", seed=5)
        return envs

    scores = greedy_returns(player, make_envs, 16, seed=3)
    rates = seat_outcome_rates(scores)
    assert set(rates) == {
        f"{seat}_{k}_rate" for seat in ("first", "second") for k in ("win", "draw", "loss")
    }
    # An untrained network's priors, but 64 simulations: random is beaten from both seats.
    assert rates["first_win_rate"] >= 0.75 and rates["second_loss_rate"] <= 0.25, rates


def test_random_opening_moves_are_uniform_over_the_legal_moves():
    cfg = tictactoe_config(
        random_opening_moves=1, simulations=4, temperature_moves=0, noise_fraction=0.0
    )
    E = 200
    policy = AlphaZeroPolicy(actor_setup(cfg, make_model(cfg), *spaces(cfg), num_envs=E))
    empty = np.tile(observation(TTT, 0, 0), (E, 1))
    first, extras = policy.act(empty, 0)
    assert len(set(first.tolist())) == 9  # every opening, where the search would pick one
    assert (extras["move"] == 0).all()
    second, _ = policy.act(empty, 1)  # the games' second moves follow the search
    assert len(set(second.tolist())) < 9
