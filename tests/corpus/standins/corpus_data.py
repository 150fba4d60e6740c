"""Local synthetic data for corpus programs whose own loading downloads a data set (the
harness, not the program). Each function is seeded: the same data in every process."""

import numpy as np


def titanic(n=1309, seed=0):
    """What ``fetch_openml("titanic", version=1, as_frame=True, return_X_y=True)`` returns:
    the same columns and dtypes (categories for sex and embarked), missing ages, fares and
    ports, and a survival label that depends on sex, class and age."""
    import pandas as pd

    rng = np.random.RandomState(seed)
    pclass = rng.choice([1.0, 2.0, 3.0], size=n, p=[0.25, 0.21, 0.54])
    sex = rng.choice(["female", "male"], size=n, p=[0.36, 0.64])
    age = np.round(rng.gamma(4.0, 7.5, size=n), 1)
    age[rng.rand(n) < 0.2] = np.nan
    fare = np.round(rng.lognormal(2.5, 1.0, size=n) * (4 - pclass), 4)
    fare[rng.rand(n) < 0.001] = np.nan
    embarked = rng.choice(["S", "C", "Q"], size=n, p=[0.7, 0.2, 0.1]).astype(object)
    embarked[rng.rand(n) < 0.002] = np.nan
    score = 1.6 * (sex == "female") - 0.6 * (pclass - 2) - 0.02 * np.nan_to_num(age - 30) + rng.normal(0, 1, n)
    survived = (score > 0.5).astype(int).astype(str)
    X = pd.DataFrame({
        "pclass": pclass,
        "name": [f"Passenger {i}" for i in range(n)],
        "sex": pd.Categorical(sex, categories=["female", "male"]),
        "age": age,
        "sibsp": rng.poisson(0.5, n).astype(float),
        "parch": rng.poisson(0.4, n).astype(float),
        "ticket": [f"T{rng.randint(10000, 99999)}" for _ in range(n)],
        "fare": fare,
        "cabin": [f"C{rng.randint(1, 150)}" if rng.rand() < 0.23 else np.nan for _ in range(n)],
        "embarked": pd.Categorical(embarked, categories=["C", "Q", "S"]),
        "boat": [str(rng.randint(1, 16)) if rng.rand() < 0.37 else np.nan for _ in range(n)],
        "body": [float(rng.randint(1, 330)) if rng.rand() < 0.09 else np.nan for _ in range(n)],
        "home.dest": [f"Town {rng.randint(0, 300)}" if rng.rand() < 0.57 else np.nan for _ in range(n)],
    })
    y = pd.Series(pd.Categorical(survived, categories=["0", "1"]), name="survived")
    return X, y


WORDS = (  # noqa: SIM905
    "the a of and to in he was that it his her with had as for on at by but not she from "
         "picture painter studio canvas light room wife jack gisburn portrait morning face hand "
         "said never thought looked moment always little own great work last quite art").split()


def story(chars=20000, seed=0):
    """English-like text in place of a downloaded short story."""
    rng = np.random.RandomState(seed)
    out, size = [], 0
    while size < chars:
        n = rng.randint(6, 18)
        sentence = " ".join(WORDS[i] for i in rng.randint(0, len(WORDS), n)).capitalize() + rng.choice([".", ".", "!", "?"])
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def sms_spam(n_ham=400, n_spam=120, seed=0):
    """Lines of ``SMSSpamCollection`` (label TAB text) in place of the UCI download."""
    rng = np.random.RandomState(seed)
    ham = "ok see you later call me when home dinner tonight love sorry late meeting tomorrow fine".split()  # noqa: SIM905
    spam = "free win prize cash claim now urgent txt call stop offer mobile award guaranteed".split()  # noqa: SIM905
    rows = [("ham", " ".join(rng.choice(ham, rng.randint(3, 15)))) for _ in range(n_ham)]
    rows += [("spam", " ".join(rng.choice(spam + ham, rng.randint(5, 20)))) for _ in range(n_spam)]
    order = rng.permutation(len(rows))
    return "".join(f"{rows[i][0]}\t{rows[i][1]}\n" for i in order)
