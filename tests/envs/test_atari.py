"""Atari envs (``zrl.envs.atari``): the preprocessing against gymnasium's ``AtariPreprocessing``
frame for frame, both backends' shapes and NEXT_STEP autoreset, evaluation's true scores,
and the errors of unknown games and bad ``env.atari`` values.

Exactness measured with ale-py 0.12.1: the native AtariVectorEnv and the sync backend equal
the hand-built gymnasium reference exactly (max abs difference 0 grey levels on every frame;
ALE's C++ resize is OpenCV's INTER_AREA too), so the tests assert equality, not a bound.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import AtariPreprocessing
from pydantic import ValidationError

from zrl.config.experiment import ConfigError, config_from_dict
from zrl.config.sections import AtariConfig, EnvConfig
from zrl.envs import atari
from zrl.envs.base import EnvError
from zrl.envs.vector import make_vector_env

BACKENDS = ["native", "sync"]


def deterministic(env_id: str, mode: str, num_envs: int = 1, **atari_cfg) -> EnvConfig:
    """No randomness: no no-ops, no sticky actions (the default)."""
    return EnvConfig(
        id=env_id, num_envs=num_envs, vectorization=mode, atari=AtariConfig(noop_max=0, **atari_cfg)
    )


def actions(n: int, num_actions: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(num_actions, size=n)


def run(env: gym.vector.VectorEnv, acts: np.ndarray, seed: int = 0):
    """Observations [T+1, N, ...], rewards, terminations, truncations and lives of acts[t]
    played in every env."""
    obs, _ = env.reset(seed=seed)
    frames, rewards, terms, truncs, lives = [np.array(obs)], [], [], [], []
    for a in acts:
        obs, r, term, trunc, info = env.step(np.full(env.num_envs, a, dtype=np.int64))
        frames.append(np.array(obs))
        rewards.append(np.asarray(r, dtype=np.float64))
        terms.append(np.asarray(term))
        truncs.append(np.asarray(trunc))
        lives.append(np.asarray(info["lives"]))
    env.close()
    return (np.stack(frames), np.stack(rewards), np.stack(terms), np.stack(truncs), np.stack(lives))


def reference(env_id: str, acts: np.ndarray, episodic_life: bool, stack: int = 4):
    """gymnasium's AtariPreprocessing on the raw game, frames stacked and NEXT_STEP autoreset
    done by hand: the stack is zeros and the newest frame after a reset, and the step after
    an episode ends only resets (reward 0, not done)."""
    raw = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(
        raw,
        noop_max=0,
        frame_skip=4,
        screen_size=84,
        terminal_on_life_loss=episodic_life,
        grayscale_obs=True,
        scale_obs=False,
    )

    def fresh(frame: np.ndarray) -> np.ndarray:
        s = np.zeros((stack, 84, 84), np.uint8)
        s[-1] = frame
        return s

    frame, _ = env.reset(seed=0)
    s = fresh(frame)
    frames, rewards, terms = [s.copy()], [], []
    ended = False
    for a in acts:
        if ended:
            frame, _ = env.reset()
            s, r, ended = fresh(frame), 0.0, False
        else:
            frame, r, term, trunc, _ = env.step(int(a))
            s = np.concatenate([s[1:], frame[None]])
            ended = bool(term or trunc)
        frames.append(s.copy())
        rewards.append(float(r))
        terms.append(ended)
    env.close()
    return np.stack(frames), np.array(rewards), np.array(terms)


@pytest.mark.parametrize("mode", BACKENDS)
def test_preprocessing_equals_gymnasium_atari_preprocessing(mode):
    # Breakout with random actions: FIRE launches the ball, points and lost lives come fast,
    # so the 150 steps cover rewards, life-loss ends and NEXT_STEP resets.
    acts = actions(150, 4, seed=1)
    cfg = deterministic("ALE/Breakout-v5", mode, fire_reset=False, clip_rewards=False)
    obs, rewards, terms, truncs, _ = run(make_vector_env(cfg), acts)
    ref_obs, ref_rewards, ref_terms = reference("ALE/Breakout-v5", acts, episodic_life=True)
    assert ref_terms.sum() >= 2 and (ref_rewards > 0).sum() >= 2  # the comparison means something
    assert obs.dtype == np.uint8 and obs.shape == (151, 1, 4, 84, 84)
    for t in range(len(obs)):  # frame for frame, so a failure names the first step that differs
        diff = np.abs(obs[t, 0].astype(int) - ref_obs[t].astype(int))
        assert diff.max() == 0, f"step {t}: {int((diff > 0).sum())} pixels differ, max {diff.max()}"
    np.testing.assert_array_equal(rewards[:, 0], ref_rewards)
    np.testing.assert_array_equal(terms[:, 0], ref_terms)
    assert not truncs.any()


def test_backends_agree_with_fire_reset_and_clipping():
    """The sync backend's FireResetEnv presses FIRE for one frame before play as
    AtariVectorEnv does; clipped rewards and life-loss ends agree too, on several envs."""
    acts = actions(120, 4, seed=1)
    runs = {
        mode: run(make_vector_env(deterministic("ALE/Breakout-v5", mode, num_envs=2)), acts)
        for mode in BACKENDS
    }
    (n_obs, n_r, n_term, _, n_lives), (s_obs, s_r, s_term, _, s_lives) = runs.values()
    assert n_term.sum() >= 4 and n_r.sum() >= 2
    np.testing.assert_array_equal(n_obs, s_obs)
    np.testing.assert_array_equal(n_r, s_r)
    np.testing.assert_array_equal(n_term, s_term)
    np.testing.assert_array_equal(n_lives, s_lives)


def test_fire_reset_matters():
    """Breakout's ball waits for FIRE: played without FIRE, the game differs with fire_reset
    (the ball is in play) and without it."""
    acts = np.array([0, 2, 3] * 10)  # NOOP, RIGHT, LEFT: never FIRE
    on = run(make_vector_env(deterministic("ALE/Breakout-v5", "native")), acts)[0]
    off = run(make_vector_env(deterministic("ALE/Breakout-v5", "native", fire_reset=False)), acts)[
        0
    ]
    assert not np.array_equal(on, off)


@pytest.mark.parametrize("mode", BACKENDS)
@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_observations_are_uint8_stacks_in_next_step_mode(env_id, mode):
    env = make_vector_env(EnvConfig(id=env_id, num_envs=2, vectorization=mode))
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert env.num_envs == 2
        assert env.single_observation_space.shape == (4, 84, 84)
        assert env.single_observation_space.dtype == np.uint8
        assert isinstance(env.single_action_space, gym.spaces.Discrete)
        assert int(env.single_action_space.n) == 6  # Pong's minimal action set
        obs, _ = env.reset(seed=3)
        assert isinstance(obs, np.ndarray) and obs.dtype == np.uint8
        assert obs.shape == (2, 4, 84, 84)
        assert not obs[:, :3].any() and obs[:, 3].any()  # zeros, then the first frame
        obs, *_ = env.step(np.zeros(2, np.int64))
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert not obs[:, :2].any() and obs[:, 2].any() and obs[:, 3].any()
    finally:
        env.close()


def test_screen_size_stack_and_rgb_are_configurable():
    cfg = EnvConfig(
        id="ALE/Pong-v5",
        num_envs=1,
        vectorization="native",
        atari=AtariConfig(screen_size=64, stack=2, grayscale=False),
    )
    for mode in BACKENDS:
        env = make_vector_env(cfg.model_copy(update={"vectorization": mode}))
        obs, _ = env.reset(seed=0)
        env.close()
        assert obs.shape == (1, 2, 64, 64, 3), mode


@pytest.mark.parametrize("mode", BACKENDS)
def test_evaluation_plays_whole_games_with_true_scores(mode):
    """Space Invaders pays 5 to 30 points an invader and has 3 lives. Training envs clip the
    rewards to 1 and end the episode at the first lost life; evaluation envs (same seed and
    actions, so the same game until that life is lost) keep the scores and play on."""
    acts = actions(260, 6, seed=2)
    cfg = deterministic("ALE/SpaceInvaders-v5", mode)
    _, train_r, train_term, _, _ = run(make_vector_env(cfg), acts)
    _, eval_r, eval_term, _, eval_lives = run(make_vector_env(cfg, evaluation=True), acts)
    first_end = int(np.flatnonzero(train_term[:, 0])[0])
    lost = int(np.flatnonzero(eval_lives[:, 0] < eval_lives[0, 0])[0])
    assert first_end == lost  # the training episode ended where the game lost a life
    assert not eval_term.any()  # the game goes on
    assert set(np.unique(train_r)) <= {0.0, 1.0}
    assert eval_r.max() > 1.0
    # Until the end the games are the same: the true scores' signs are the clipped rewards.
    np.testing.assert_array_equal(np.sign(eval_r[: first_end + 1]), train_r[: first_end + 1])


def test_evaluation_flags_reach_atari_vector_env():
    cfg = EnvConfig(id="ALE/Pong-v5")
    train = atari.native_kwargs(cfg)
    assert train["episodic_life"] is True and train["reward_clipping"] is True
    test = atari.native_kwargs(cfg, evaluation=True)
    assert test["episodic_life"] is False and test["reward_clipping"] is False
    assert test["frameskip"] == 4 and test["noop_max"] == 30 and test["stack_num"] == 4
    assert test["repeat_action_probability"] == 0.0 and test["use_fire_reset"] is True
    assert test["max_num_frames_per_episode"] == 108_000
    off = EnvConfig(id="ALE/Pong-v5", atari=AtariConfig(clip_rewards=False, episodic_life=False))
    assert atari.native_kwargs(off)["reward_clipping"] is False
    assert atari.native_kwargs(off)["episodic_life"] is False
    assert cfg.atari.episodic_life is True  # evaluation does not change the config


def test_evaluator_asks_for_evaluation_envs():
    from zrl.roles.evaluator import Evaluator

    calls = []

    class Role:
        def make_envs(self, num_envs, evaluation=False):
            calls.append((num_envs, evaluation))

    Evaluator.make_eval_envs(Role(), 5)  # type: ignore[arg-type]
    assert calls == [(5, True)]


def test_non_atari_envs_ignore_evaluation():
    env = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=2), evaluation=True)
    assert env.single_observation_space.shape == (4,)
    env.close()


@pytest.mark.parametrize(
    ("env_id", "game"),
    [
        ("ALE/Pong-v5", "pong"),
        ("PongNoFrameskip-v4", "pong"),
        ("ALE/SpaceInvaders-v5", "space_invaders"),
        ("MsPacmanNoFrameskip-v4", "ms_pacman"),
        ("ALE/UpNDown-v5", "up_n_down"),
        ("ALE/Pitfall2-v5", "pitfall2"),
    ],
)
def test_game_names(env_id, game):
    assert atari.is_atari(env_id)
    assert atari.game_name(env_id) == game


def test_is_atari():
    assert not atari.is_atari("CartPole-v1")
    assert not atari.is_atari("Pong-v4")  # frameskip baked in: not preprocessed
    assert atari.is_atari("ale_py:ALE/Breakout-v5")


@pytest.mark.parametrize("mode", ["auto", "sync"])
@pytest.mark.parametrize("env_id", ["ALE/NoSuchGame-v5", "NoSuchGameNoFrameskip-v4"])
def test_unknown_game_is_an_env_error_naming_the_id(env_id, mode):
    with pytest.raises(EnvError, match=env_id) as err:
        make_vector_env(EnvConfig(id=env_id, num_envs=1, vectorization=mode))
    assert "no_such_game" in str(err.value)


def test_close_misspelling_is_suggested():
    with pytest.raises(EnvError, match="did you mean pong"):
        atari.game_name("ALE/Pongg-v5")


def test_ram_ids_are_refused():
    with pytest.raises(EnvError, match="ALE/Pong-v5"):
        make_vector_env(EnvConfig(id="ALE/Pong-ram-v5", num_envs=1))


def test_bad_atari_kwargs_are_an_env_error():
    with pytest.raises(EnvError, match="ALE/Pong-v5"):
        make_vector_env(EnvConfig(id="ALE/Pong-v5", num_envs=1, kwargs={"bogus": 1}))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frameskip", 0),
        ("stack", 0),
        ("noop_max", -1),
        ("screen_size", 4),
        ("repeat_action_probability", 1.0),
        ("num_threads", -1),
        ("max_episode_frames", 0),
        ("episodic_life", "sometimes"),
    ],
)
def test_bad_atari_values_are_validation_errors_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        AtariConfig(**{field: value})
    with pytest.raises(ConfigError, match=f"env.atari.{field}"):
        config_from_dict({"env": {"id": "ALE/Pong-v5", "atari": {field: value}}})


def test_unknown_atari_key_is_an_error():
    with pytest.raises(ConfigError, match="env.atari.frame_stack"):
        config_from_dict({"env": {"atari": {"frame_stack": 4}}})


def test_envpool_missing_is_a_clear_env_error(monkeypatch):
    monkeypatch.setattr(atari, "envpool_installed", lambda: False)
    with pytest.raises(EnvError, match=r'pip install -e "\.\[envpool\]"'):
        make_vector_env(EnvConfig(id="ALE/Pong-v5", num_envs=1, vectorization="envpool"))
    with pytest.raises(EnvError, match="Atari ids only"):
        make_vector_env(EnvConfig(id="CartPole-v1", num_envs=1, vectorization="envpool"))


def test_describe():
    text = atari.describe(EnvConfig(id="ALE/Pong-v5"))
    assert text == (
        "Pong via AtariVectorEnv, frameskip 4: 1 env step = 4 frames, 84x84x4 uint8, "
        "rewards clipped for training, episodic life for training"
    )
    sync = EnvConfig(
        id="BreakoutNoFrameskip-v4",
        vectorization="sync",
        atari=AtariConfig(clip_rewards=False, episodic_life=False),
    )
    text = atari.describe(sync)
    assert text.startswith("Breakout via gymnasium AtariPreprocessing (sync), frameskip 4")
    assert "rewards unclipped" in text and "episodic life" not in text


@pytest.mark.parametrize("env_id", ["PongNoFrameskip-v4", "ALE/Pong-v5"])
def test_preflight_accepts_atari_ids(env_id):
    from zrl.run.preflight import check_env

    obs_space, act_space = check_env(config_from_dict({"env": {"id": env_id}}))
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
    assert int(act_space.n) == 6


def test_preflight_names_an_unknown_game():
    from zrl.run.preflight import check_env

    with pytest.raises(ConfigError, match=r"env.id: 'ALE/Pongg-v5'.*did you mean pong"):
        check_env(config_from_dict({"env": {"id": "ALE/Pongg-v5"}}))
